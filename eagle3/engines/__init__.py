"""What runs the verifier: generation backends, hidden-state capture, and vLLM's speculative decoding."""
