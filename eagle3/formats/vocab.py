"""data/vocab/vocab.safetensors: the draft's output vocabulary, in the dtypes vLLM reads.

    d2t  int64 [draft_vocab]   target_id = draft_id + d2t[draft_id]
    t2d  bool  [vocab]         whether a target (verifier) token is in the draft vocab

Written by the vocab stage; train and export read it, and export copies both tensors into the draft.
Never stored in a float dtype: a float d2t rounds large offsets (vLLM then maps drafts to wrong tokens).
Read back as untrusted (it travels through remotes): both tensors of these dtypes, t2d the verifier's vocab
long, the target ids ascending (draft ids are assigned in target-id order) within it, and t2d true exactly at
them.
"""

from pathlib import Path
from typing import NamedTuple

import torch
from safetensors.torch import save_file

from eagle3.errors import Eagle3Error
from eagle3.files import atomic_path
from eagle3.formats.tensor_files import matching_tensors, tensor_shapes
from eagle3.paths import VOCAB_FILE

_FIX = "rerun `eagle3 vocab` to rewrite it"


class VocabMaps(NamedTuple):
    """The draft vocabulary's two maps, as the module doc defines them."""

    d2t: torch.Tensor
    t2d: torch.Tensor


def save_vocab(root: Path, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
    with atomic_path(root / VOCAB_FILE) as partial:
        save_file({"d2t": d2t.to(torch.int64), "t2d": t2d.to(torch.bool)}, str(partial))


def load_vocab(root: Path, vocab_size: int) -> VocabMaps:
    """The maps for a verifier of `vocab_size` tokens, checked as the module doc says."""
    path = root / VOCAB_FILE
    if not path.is_file():
        raise Eagle3Error(f"{path}: missing; run `dvc repro vocab` (or `eagle3 vocab`) first")
    draft_shape = tensor_shapes(path, _FIX).get("d2t", ())
    if len(draft_shape) != 1 or not 1 <= draft_shape[0] <= vocab_size:
        raise Eagle3Error(
            f"{path}: d2t has shape {list(draft_shape)}, expected [draft vocab size] of 1 to the verifier's "
            f"{vocab_size} tokens; {_FIX}"
        )
    expected: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
        "d2t": (draft_shape, torch.int64),
        "t2d": ((vocab_size,), torch.bool),
    }
    tensors = matching_tensors(path, expected, _FIX)
    d2t, t2d = tensors["d2t"], tensors["t2d"]
    targets = draft_to_target(d2t)
    outside = targets[(targets < 0) | (targets >= vocab_size)]
    if len(outside):
        raise Eagle3Error(
            f"{path}: d2t maps a draft id to target id {int(outside[0])}, outside the verifier's vocab "
            f"[0, {vocab_size}); {_FIX}"
        )
    if bool((targets[1:] <= targets[:-1]).any()):
        raise Eagle3Error(f"{path}: d2t's target ids are not strictly ascending (a repeated or reordered id); {_FIX}")
    unmarked = targets[~t2d[targets]]
    if len(unmarked):
        raise Eagle3Error(f"{path}: t2d does not mark target id {int(unmarked[0])}, which d2t maps to; {_FIX}")
    if int(t2d.sum()) != len(d2t):
        raise Eagle3Error(f"{path}: t2d marks {int(t2d.sum())} target ids, d2t maps {len(d2t)}; {_FIX}")
    return VocabMaps(d2t, t2d)


def draft_to_target(d2t: torch.Tensor) -> torch.Tensor:
    """The verifier token id of every draft id."""
    return torch.arange(len(d2t)) + d2t
