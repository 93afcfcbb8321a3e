"""The EAGLE-3 draft model as vLLM runs it."""
