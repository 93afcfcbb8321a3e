"""eagle3: reproducible EAGLE-3 draft training for vLLM."""
