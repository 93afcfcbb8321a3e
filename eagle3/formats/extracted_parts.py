"""data/hidden/<split>/part-PPPPP.done.json: extract has finished every shard planned from synthetic part PPPPP.

    {"shards": [the part's shard file names, in plan order], "counts": {what planning it counted, by name}}

`counts` holds `truncated` (sequences cut at extract.max_seq_len) and `skipped_<reason>` (records left out).
Written atomically after the part's last shard. A part is done when its record exists and every shard it names
is on disk, so a deleted shard is redone and a restart skips done parts without reading them; the index
(eagle3/formats/shards.py `write_index`) and the stage's metrics are built from these records. Read back as
untrusted (data/hidden travels through remotes): the shard names must be the part's own, in plan order, and the
counts non-negative integers under those names.
"""

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError, with_config
from typing_extensions import TypedDict

from eagle3.errors import Eagle3Error, field_problem
from eagle3.files import read_json, write_json
from eagle3.formats.shards import shard_name

_COUNT_NAME = re.compile(r"^(truncated|skipped_[A-Za-z0-9_]{1,100})$")


@with_config(ConfigDict(strict=True, extra="forbid"))
class _Record(TypedDict):
    shards: list[str]
    counts: dict[str, Annotated[int, Field(ge=0)]]


_RECORD = TypeAdapter(_Record)


@dataclass(frozen=True)
class PartDone:
    shards: list[str]
    counts: dict[str, int]


def done_path(split_dir: Path, part: int) -> Path:
    return split_dir / f"part-{part:05d}.done.json"


def write_done(split_dir: Path, part: int, record: PartDone) -> None:
    write_json(done_path(split_dir, part), {"shards": record.shards, "counts": dict(sorted(record.counts.items()))})


def read_done(split_dir: Path, part: int) -> PartDone:
    path = done_path(split_dir, part)
    fix = f"delete it and rerun `eagle3 extract` to redo part {part}"
    try:
        record = _RECORD.validate_python(read_json(path, ""))
    except ValidationError as exc:
        raise Eagle3Error(f"{path}: {field_problem(exc)}; {fix}") from None
    planned = [shard_name(part, number) for number in range(len(record["shards"]))]
    if record["shards"] != planned:
        wrong = next(name for name, own in zip(record["shards"], planned, strict=True) if name != own)
        raise Eagle3Error(f"{path}: shards: {wrong!r} is not this part's next shard ({planned[0]}, ...); {fix}")
    unknown = sorted(name for name in record["counts"] if not _COUNT_NAME.match(name))
    if unknown:
        raise Eagle3Error(f"{path}: counts: {unknown[0]!r} is not truncated or skipped_<reason>; {fix}")
    return PartDone(record["shards"], record["counts"])


def is_done(split_dir: Path, part: int) -> bool:
    return done_path(split_dir, part).is_file() and all(
        (split_dir / name).is_file() for name in read_done(split_dir, part).shards
    )
