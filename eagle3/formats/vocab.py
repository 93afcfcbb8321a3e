"""data/vocab/vocab.safetensors: the draft's output vocabulary, in the dtypes vLLM reads.

    d2t  int64 [draft_vocab]   target_id = draft_id + d2t[draft_id]
    t2d  bool  [vocab]         whether a target (verifier) token is in the draft vocab

Written by the vocab stage; train and export read it, and export copies both tensors into the draft.
Never stored in a float dtype: a float d2t rounds large offsets (vLLM then maps drafts to wrong tokens).
"""

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from eagle3.errors import Eagle3Error
from eagle3.files import atomic_path
from eagle3.paths import VOCAB_FILE


def save_vocab(root: Path, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
    with atomic_path(root / VOCAB_FILE) as partial:
        save_file({"d2t": d2t.to(torch.int64), "t2d": t2d.to(torch.bool)}, str(partial))


def load_vocab(root: Path) -> tuple[torch.Tensor, torch.Tensor]:
    path = root / VOCAB_FILE
    if not path.is_file():
        raise Eagle3Error(f"{path}: missing; run `dvc repro vocab` (or `eagle3 vocab`) first")
    tensors = load_file(path)
    return tensors["d2t"], tensors["t2d"]


def draft_to_target(d2t: torch.Tensor) -> torch.Tensor:
    """The verifier token id of every draft id."""
    return torch.arange(len(d2t)) + d2t
