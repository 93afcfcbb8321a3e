"""params.yaml `vocab:` — the draft model's output vocabulary."""

from pydantic import PositiveInt

from eagle3.params.base import Section


class VocabParams(Section):
    # The draft predicts over this many of the verifier's tokens: the most frequent loss-masked (assistant) tokens
    # of the training split. SmolLM2's answers use ~6-7.5K distinct tokens (8192 covers them); Kimi drafts use 32000.
    draft_vocab_size: PositiveInt = 8192
