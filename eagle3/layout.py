"""Where each stage's outputs live, and how later stages find the verifier.

Kept apart from the stages' code so a stage's DVC deps can name this small
module instead of another stage's implementation.
"""

import json
from pathlib import Path
from typing import Any

from eagle3.errors import Eagle3Error

VERIFIER_DIR = Path("models/verifier")
PROVENANCE = "provenance.json"
PREPARED_DIR = Path("data/prepared")
SYNTHETIC_DIR = Path("data/synthetic")
HIDDEN_DIR = Path("data/hidden")
VOCAB_DIR = Path("data/vocab")
CHECKPOINT_DIR = Path("checkpoints")
# DVCLive writes the training curves here (metrics.json + plots/metrics/*.tsv) for `dvc plots show`.
TRAIN_LOG_DIR = Path("metrics/train")
DRAFT_DIR = Path("models/draft")
SPECULATORS_DRAFT_DIR = Path("models/draft-speculators")
METRICS_DIR = Path("metrics")


def read_provenance(root: Path) -> dict[str, Any]:
    path = root / VERIFIER_DIR / PROVENANCE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise Eagle3Error(f"{path}: missing; run `dvc repro verifier` (or `eagle3 verifier`) first") from None


def verifier_dir(root: Path) -> Path:
    """Where the verifier's HF files are: the converted copy, or the referenced local directory."""
    provenance = read_provenance(root)
    if provenance["source"]["kind"] == "local":
        return (root / provenance["source"]["path"]).resolve()
    return root / VERIFIER_DIR


def train_shards(root: Path, split: str = "train") -> list[Path]:
    """The extract stage's shards of one split, in order (its index.json lists them)."""
    index = root / HIDDEN_DIR / "index.json"
    try:
        listed = json.loads(index.read_text(encoding="utf-8"))["splits"].get(split, [])
    except FileNotFoundError:
        raise Eagle3Error(f"{index}: missing; run `dvc repro extract` (or `eagle3 extract`) first") from None
    if not listed:
        raise Eagle3Error(f"{index}: no {split!r} shards; add {split!r} to extract.splits and rerun `eagle3 extract`")
    return [root / HIDDEN_DIR / split / entry["shard"] for entry in listed]
