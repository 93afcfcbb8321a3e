"""Conversations: the row schema, reasoning text, and rendering through the verifier's chat template."""
