"""data/hidden/<split>/part-PPPPP.done.json: extract has finished every shard planned from synthetic part PPPPP.

    {"shards": [the part's shard file names, in plan order], "counts": {what planning it counted, by name}}

`counts` holds `truncated` (sequences cut at extract.max_seq_len) and `skipped_<reason>` (records left out).
Written atomically after the part's last shard. A part is done when its record exists and every shard it names
is on disk, so a deleted shard is redone and a restart skips done parts without reading them; the index
(eagle3/formats/shards.py `write_index`) and the stage's metrics are built from these records.
"""

from dataclasses import dataclass
from pathlib import Path

from eagle3.files import read_json, write_json


@dataclass(frozen=True)
class PartDone:
    shards: list[str]
    counts: dict[str, int]


def done_path(split_dir: Path, part: int) -> Path:
    return split_dir / f"part-{part:05d}.done.json"


def write_done(split_dir: Path, part: int, record: PartDone) -> None:
    write_json(done_path(split_dir, part), {"shards": record.shards, "counts": dict(sorted(record.counts.items()))})


def read_done(split_dir: Path, part: int) -> PartDone:
    data = read_json(done_path(split_dir, part), "")
    return PartDone(list(data["shards"]), dict(data["counts"]))


def is_done(split_dir: Path, part: int) -> bool:
    return done_path(split_dir, part).is_file() and all(
        (split_dir / name).is_file() for name in read_done(split_dir, part).shards
    )
