"""Hidden-state capture for the extract stage: the HF and vLLM backends behind one interface (base.py)."""
