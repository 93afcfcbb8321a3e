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

Parts travel through DVC remotes, so they are read back as untrusted: the zstd frame must declare its size
(generate's always does) and inflate at most `_MAX_INFLATION` times its compressed size (or to `_SMALL_PART`),
checked before anything is decompressed, and every record must have exactly the fields above, of their types.
"""

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, NotRequired

import zstandard
from pydantic import ConfigDict, Field, TypeAdapter, ValidationError, with_config
from typing_extensions import TypedDict

from eagle3.errors import Eagle3Error, field_problem
from eagle3.files import read_json, write_bytes, write_json
from eagle3.hashing import sha256_file
from eagle3.paths import SYNTHETIC_DIR, SYNTHETIC_MANIFEST
from eagle3.resume import RUN_FILE

# Part of generate's run key: bump when the record format changes, so parts in the old format are remade, not mixed in.
FORMAT_VERSION = 3
PART_PATTERN = re.compile(r"^part-(\d{5})\.jsonl\.zst$")
_LEVEL = 3
# JSON of model text inflates a few times; answers that loop until max_tokens inflate far more, but a part of
# nothing else stays well below this, while a decompression bomb (zeros: thousands of times) does not.
_MAX_INFLATION = 1000
# A part this small may inflate as it likes: it cannot cost much memory.
_SMALL_PART = 2**26
_STRICT = ConfigDict(strict=True, extra="forbid")
_Count = Annotated[int, Field(ge=0)]


@with_config(_STRICT)
class _Message(TypedDict):
    role: str
    content: str
    reasoning: NotRequired[str | None]


@with_config(_STRICT)
class _Turn(TypedDict):
    finish_reason: str | None
    prompt_tokens: _Count
    completion_tokens: _Count
    reasoning_format: str | None


@with_config(_STRICT)
class SyntheticRecord(TypedDict):
    id: Annotated[str, Field(pattern=r"^[^\x00-\x1f\x7f]{1,256}$")]
    source: str
    origin: str
    prompt_hash: str
    status: Literal["ok", "skipped"]
    # Extract counts skipped records under this reason (eagle3/formats/extracted_parts.py).
    skip_reason: Annotated[str, Field(pattern=r"^[A-Za-z0-9_]{1,100}$")] | None
    truncated_reason: str | None
    messages: list[_Message]
    turns: list[_Turn]
    sampling: dict[str, Any]
    chat_template_kwargs: dict[str, Any]
    verifier: str
    backend: str


_RECORD = TypeAdapter(SyntheticRecord)


def part_path(split_dir: Path, index: int) -> Path:
    return split_dir / f"part-{index:05d}.jsonl.zst"


def write_part(path: Path, records: list[dict[str, Any]]) -> None:
    payload = "".join(json.dumps(record, sort_keys=True, ensure_ascii=False) + "\n" for record in records)
    write_bytes(path, zstandard.ZstdCompressor(level=_LEVEL).compress(payload.encode("utf-8")))


def read_part(path: Path) -> list[SyntheticRecord]:
    """A part's records, as `write_part` was given them; a part that is not one is one error naming it (and the
    record)."""
    fix = "delete it and rerun `eagle3 generate` to regenerate it"
    data = path.read_bytes()
    limit = max(_SMALL_PART, _MAX_INFLATION * len(data))
    try:
        declared = zstandard.frame_content_size(data)
    except zstandard.ZstdError as exc:
        raise Eagle3Error(f"{path}: damaged part ({exc}); {fix}") from None
    if declared < 0:
        raise Eagle3Error(f"{path}: the part's zstd frame declares no size (generate's always does); {fix}")
    if declared > limit:
        raise Eagle3Error(
            f"{path}: the part declares {declared} bytes decompressed, over {_MAX_INFLATION}x its {len(data)} "
            f"compressed bytes: not a part generate wrote (a decompression bomb?); {fix}"
        )
    try:
        raw = zstandard.ZstdDecompressor().decompress(data, max_output_size=declared, allow_extra_data=False)
        text = raw.decode("utf-8")
    except (zstandard.ZstdError, UnicodeDecodeError) as exc:
        raise Eagle3Error(f"{path}: damaged part ({exc}); {fix}") from None
    records = []
    # Split at "\n" only: str.splitlines also splits at U+2028 and U+0085, which JSON leaves unescaped in text.
    for number, line in enumerate(text.removesuffix("\n").split("\n") if text else []):
        try:
            # Parsed by the json module: pydantic's own parser would keep strings it saw in a process-wide cache.
            parsed = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise Eagle3Error(f"{path}: record {number}: not JSON ({exc}); {fix}") from None
        try:
            records.append(_RECORD.validate_python(parsed))
        except ValidationError as exc:
            raise Eagle3Error(f"{path}: record {number}: {field_problem(exc)}; {fix}") from None
        if (records[-1]["status"] == "skipped") != (records[-1]["skip_reason"] is not None):
            raise Eagle3Error(f"{path}: record {number}: status and skip_reason disagree; {fix}")
    return records


def finished_parts(split_dir: Path) -> dict[int, Path]:
    if not split_dir.is_dir():
        return {}
    parts = {}
    for path in split_dir.iterdir():
        match = PART_PATTERN.match(path.name)
        if match:
            parts[int(match[1])] = path
    return parts


def iter_records(root: Path, split: str) -> Iterator[SyntheticRecord]:
    """Every record of a split, in prepared order."""
    parts = finished_parts(root / SYNTHETIC_DIR / split)
    for index in sorted(parts):
        yield from read_part(parts[index])


_TEMPLATE_KWARGS = TypeAdapter(dict[str, Any], config=_STRICT)


def generated_template_kwargs(root: Path) -> dict[str, Any]:
    """The chat_template_kwargs generate rendered every conversation with (its run settings): what a later stage
    that asks the verifier passes to the chat template, so it asks as the training answers were made."""
    path = root / SYNTHETIC_DIR / RUN_FILE
    how = "run `dvc repro generate` (or `dvc pull data/synthetic`) first"
    if not path.is_file():
        raise Eagle3Error(f"{path}: missing; {how}")
    run = read_json(path, how)
    try:
        return _TEMPLATE_KWARGS.validate_python(run["settings"]["generate"]["chat_template_kwargs"])
    except (KeyError, TypeError):
        raise Eagle3Error(f"{path}: no settings.generate.chat_template_kwargs; {how}") from None
    except ValidationError as exc:
        raise Eagle3Error(f"{path}: settings.generate.chat_template_kwargs: {field_problem(exc)}; {how}") from None


@with_config(_STRICT)
class ManifestEntry(TypedDict):
    # pydantic's regex engine (Rust's) ends `$` at the end of the text only: no trailing newline slips through.
    part: Annotated[str, Field(pattern=PART_PATTERN.pattern)]
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    records: _Count


_MANIFEST = TypeAdapter(dict[str, list[ManifestEntry]])


def read_manifest(path: Path) -> dict[str, list[ManifestEntry]]:
    """generate's manifest, checked (it travels through remotes): every split's parts, each a part file name."""
    if not path.is_file():
        raise Eagle3Error(f"{path}: missing; run `dvc repro generate` first")
    try:
        return _MANIFEST.validate_python(read_json(path, "run `dvc repro generate` first"))
    except ValidationError as exc:
        raise Eagle3Error(f"{path}: {field_problem(exc)}; rerun `eagle3 generate` to rewrite it") from None


def write_manifest(out: Path, splits: Iterable[str]) -> None:
    """The last file written: every finished part of every split with its sha256 and record count."""
    manifest = {}
    for split in splits:
        parts = finished_parts(out / split)
        manifest[split] = [
            {"part": path.name, "sha256": sha256_file(path), "records": len(read_part(path))}
            for path in (parts[i] for i in sorted(parts))
        ]
    write_json(out / SYNTHETIC_MANIFEST.name, manifest)
