"""data/prepared/: the prompt datasets after validation, deduplication, caps and the held-out split.

    train.parquet, heldout.parquet   one row per conversation (zstd parquet, schema `SCHEMA`):
                                     id (first 16 hex of prompt_hash), source (sub-source: the row's own
                                     `source`, else the input's name), origin (the input's name), prompt_hash
                                     (sha256 of the normalised prompt side, eagle3/chat/conversations.py),
                                     messages [{role, content}]
    card.json                        the dataset card: every input (path and sha256, or hub id, revision and
                                     fingerprint) with its license, rows read/valid, drops by reason with
                                     examples, duplicates, caps, counts per sub-source and per split, and each
                                     output file's sha256 and `content_sha256` (a hash of the rows themselves,
                                     independent of the parquet encoder)

Written by the prepare stage; generate reads the rows, evaluate the held-out prompts, report the card.
"""

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from eagle3.errors import Eagle3Error
from eagle3.files import read_json
from eagle3.paths import PREPARED_CARD, prepared_split

SPLITS = ("train", "heldout")
SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("source", pa.string()),
        ("origin", pa.string()),
        ("prompt_hash", pa.string()),
        ("messages", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
    ]
)
SCHEMA_NAME = "eagle3.prepared/1: id, source, origin, prompt_hash, messages[{role, content}]"


def read_rows(root: Path, split: str, columns: list[str] | None = None) -> list[dict[str, Any]]:
    path = root / prepared_split(split)
    if not path.is_file():
        raise Eagle3Error(f"{path}: missing; run `dvc repro prepare` first")
    return pq.read_table(path, columns=columns).to_pylist()


def read_card(root: Path) -> dict[str, Any]:
    return read_json(root / PREPARED_CARD, "run `dvc repro prepare` first")


def content_sha256(root: Path, split: str) -> str:
    """The rows' own hash as the card records it: what later stages pin instead of the parquet bytes."""
    return read_card(root)["files"][f"{split}.parquet"]["content_sha256"]
