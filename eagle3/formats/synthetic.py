"""The regenerated-conversation format (data/synthetic/), written by `generate`, read by later stages.

Layout::

    data/synthetic/run.json                  what produced the parts (run key + settings)
    data/synthetic/<split>/part-NNNNN.jsonl.zst
    data/synthetic/manifest.json             written last: every part with its sha256 and counts

Part N holds prepared rows [N*chunk_size, (N+1)*chunk_size) of its split, one
JSON record per line, zstd-compressed, written whole (temp file + rename) once
every sample in it is finished. The set of parts therefore does not depend on
when or how often the stage was interrupted, and parts from several
ranks/machines merge by copying them into one directory.

Record: id, source, origin, prompt_hash, status ("ok" | "skipped"),
skip_reason, truncated_reason (a later turn could not be generated: the
conversation ends after the last generated turn), messages [{role, content, reasoning?}], turns [{finish_reason,
prompt_tokens, completion_tokens, reasoning_format}], sampling, chat_template_kwargs (what every render of the
conversation passes to the chat template), verifier, backend. `content` is the assistant text exactly as the verifier
returned it; `reasoning` is what a server-side reasoning parser split off (None otherwise), so the chat template can
render the turn as serving does.
"""

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import zstandard

from eagle3.errors import Eagle3Error
from eagle3.files import write_bytes, write_json
from eagle3.hashing import sha256_file
from eagle3.paths import SYNTHETIC_DIR, SYNTHETIC_MANIFEST

# Part of generate's run key: bump when the record format changes, so parts in the old format are remade, not mixed in.
FORMAT_VERSION = 3
PART_PATTERN = re.compile(r"^part-(\d{5})\.jsonl\.zst$")
_LEVEL = 3


def part_path(split_dir: Path, index: int) -> Path:
    return split_dir / f"part-{index:05d}.jsonl.zst"


def write_part(path: Path, records: list[dict[str, Any]]) -> None:
    payload = "".join(json.dumps(record, sort_keys=True, ensure_ascii=False) + "\n" for record in records)
    write_bytes(path, zstandard.ZstdCompressor(level=_LEVEL).compress(payload.encode("utf-8")))


def read_part(path: Path) -> list[dict[str, Any]]:
    try:
        raw = zstandard.ZstdDecompressor().decompress(path.read_bytes())
        return [json.loads(line) for line in raw.decode("utf-8").splitlines()]
    except (zstandard.ZstdError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise Eagle3Error(
            f"{path}: damaged part ({exc}); delete it and rerun `eagle3 generate` to regenerate it"
        ) from None


def finished_parts(split_dir: Path) -> dict[int, Path]:
    if not split_dir.is_dir():
        return {}
    parts = {}
    for path in split_dir.iterdir():
        match = PART_PATTERN.match(path.name)
        if match:
            parts[int(match[1])] = path
    return parts


def iter_records(root: Path, split: str) -> Iterator[dict[str, Any]]:
    """Every record of a split, in prepared order."""
    parts = finished_parts(root / SYNTHETIC_DIR / split)
    for index in sorted(parts):
        yield from read_part(parts[index])


def write_manifest(out: Path, splits: list[str]) -> None:
    """The last file written: every finished part of every split with its sha256 and record count."""
    manifest = {}
    for split in splits:
        parts = finished_parts(out / split)
        manifest[split] = [
            {"part": path.name, "sha256": sha256_file(path), "records": len(read_part(path))}
            for path in (parts[i] for i in sorted(parts))
        ]
    write_json(out / SYNTHETIC_MANIFEST.name, manifest)
