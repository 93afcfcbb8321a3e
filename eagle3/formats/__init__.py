"""Every on-disk format, one module each, with its specification in the module docstring."""
