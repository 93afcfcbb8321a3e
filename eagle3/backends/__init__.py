"""Generation backends. Each exposes process(chunks, on_done) and close(); see eagle3/generate.py."""
