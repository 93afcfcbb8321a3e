"""Publishing a draft: the lineage record, the license gate, the model card, and what must never be published."""
