"""Exported drafts for the tests that hand one to vLLM or to the export's own checks: `draft` written in both formats
(eagle3/formats/exported_draft.py) to OUT/draft and OUT/speculators, its vocabulary every other token of the
verifier's, so that d2t's offsets are exercised."""

from pathlib import Path

import torch

from eagle3.formats.exported_draft import write_drafts
from eagle3.modeling.draft import Eagle3Draft
from eagle3.stages.vocab import mapping


def export_every_other_token(
    draft: Eagle3Draft,
    out: Path,
    vocab: int,
    *,
    dtype: str,
    k: int,
    verifier_name: str,
    architectures: list[str],
    draft_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t, t2d) of the draft written to out/draft and out/speculators: the verifier's tokens 0, 2, 4, ... of its
    `vocab`, the first `draft_tokens` of them (default: all, half the vocabulary)."""
    tokens = torch.arange(0, vocab, 2)[:draft_tokens]
    d2t, t2d = mapping(tokens, vocab)
    write_drafts(
        draft,
        d2t,
        t2d,
        out / "draft",
        out / "speculators",
        dtype=dtype,
        num_speculative_tokens=k,
        verifier_name=verifier_name,
        verifier_architectures=architectures,
    )
    return d2t, t2d
