"""What a shard declares, checked before any of it is read: its header, its index, each record's head and
sections, and data/hidden/index.json. The layout itself is the spec in eagle3/formats/shards.py.

Shards travel through DVC remotes, so a reader takes them as untrusted data: a checksum proves the bytes are
what some writer wrote, not that the writer was this code. Every header and index field is validated by type
(strictly: no "5" for 5, no true for 1) and range into the values the codec then trusts; a record's head must
agree with them, its raw sections must have exactly the sizes the head implies and its zstd sections must each
be one frame declaring exactly the size it decodes to. So what a read allocates is bounded by the record's
length and the states its shard declares for it, and anything else is a `ShardError` naming the file and field.
"""

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import zstandard
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, with_config
from typing_extensions import TypedDict

from eagle3.errors import Eagle3Error, field_problem
from eagle3.formats.storage import STORAGES, StorageName

# A record's head: u32 tokens, layers, hidden, then the byte lengths of its six sections.
RECORD_HEAD = struct.Struct("<9I")
_STRICT = ConfigDict(strict=True, extra="forbid")
REEXTRACT = "delete it and rerun `eagle3 extract`"

# Bounds no real verifier reaches, so that a record's declared size (layers x tokens x hidden) stays what the
# index makes it and a hostile header cannot multiply it.
MAX_LAYERS, MAX_HIDDEN = 2**10, 2**18
Count = Annotated[int, Field(ge=0)]
LayerId = Annotated[int, Field(ge=0, lt=2**16)]
LayerIds = Annotated[list[LayerId], Field(min_length=2, max_length=MAX_LAYERS)]
HiddenSize = Annotated[int, Field(ge=1, le=MAX_HIDDEN)]
# Printable and short: ids and names are echoed in one-line errors.
SampleId = Annotated[str, Field(pattern=r"^[^\x00-\x1f\x7f]{1,256}$")]
# A file name inside the split's directory: no separator, no leading dot (`..`, partial files).
ShardFileName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}\.e3sh$")]


class ShardError(Eagle3Error):
    """A shard that cannot be trusted: damaged, truncated, or made for another verifier or layout."""


class _Codec(BaseModel):
    model_config = _STRICT
    aux: str
    final: str
    # Informative only (any zstd parameters decode the same way), but still in zstd's ranges.
    level: int = Field(ge=-(2**17), le=zstandard.MAX_COMPRESSION_LEVEL)
    hash_log: int = Field(ge=zstandard.HASHLOG_MIN, le=zstandard.HASHLOG_MAX)


class _Header(BaseModel):
    model_config = _STRICT
    format: Literal["eagle3-shard"]
    version: int
    verifier: str = Field(min_length=1, max_length=1024)
    layer_ids: LayerIds
    hidden_size: HiddenSize
    tokenizer_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    dtype: Literal["bfloat16"]
    storage: StorageName
    codec: _Codec


@with_config(_STRICT)
class IndexEntry(TypedDict):
    id: SampleId
    offset: Count
    length: Count
    # A record's head holds u32 counts; int32 positions everywhere downstream.
    tokens: Annotated[int, Field(ge=1, lt=2**31)]
    loss_tokens: Count
    xxh3: Annotated[int, Field(ge=0, lt=2**64)]


@with_config(_STRICT)
class _Index(TypedDict):
    samples: list[IndexEntry]


@with_config(_STRICT)
class _Listed(TypedDict):
    shard: ShardFileName
    samples: Count
    tokens: Count
    loss_tokens: Count
    bytes: Count


@with_config(_STRICT)
class HiddenIndex(TypedDict):
    layer_ids: LayerIds
    hidden_size: HiddenSize
    splits: dict[str, list[_Listed]]


_INDEX, _HIDDEN_INDEX = TypeAdapter(_Index), TypeAdapter(HiddenIndex)


def _json(path: Path, data: bytes, what: str) -> dict[str, Any]:
    """The JSON object in `data`, parsed by the json module: pydantic's own parser would keep strings it saw
    (every sample id) in a process-wide cache."""
    try:
        parsed = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ShardError(f"{path}: shard {what}: not JSON ({exc}); {REEXTRACT}") from None
    if not isinstance(parsed, dict):
        raise ShardError(f"{path}: shard {what}: a JSON {type(parsed).__name__}, not an object; {REEXTRACT}")
    return parsed


def header_fields(path: Path, header: bytes, version: int) -> dict[str, Any]:
    """The ShardMeta fields of a shard's header, each validated; the codec must be the one its storage names."""
    try:
        parsed = _Header.model_validate(_json(path, header, "header"))
    except ValidationError as exc:
        raise ShardError(f"{path}: shard header: {field_problem(exc)}; {REEXTRACT}") from None
    if parsed.version != version:
        raise ShardError(
            f"{path}: shard header: version {parsed.version}, but the file's prefix says {version}; {REEXTRACT}"
        )
    if len(set(parsed.layer_ids)) != len(parsed.layer_ids):
        raise ShardError(f"{path}: shard header: layer_ids {parsed.layer_ids} repeat a layer; {REEXTRACT}")
    storage = STORAGES[parsed.storage]
    if (parsed.codec.aux, parsed.codec.final) != (storage.aux, storage.final):
        raise ShardError(
            f"{path}: shard header: codec aux/final {parsed.codec.aux}/{parsed.codec.final}, but storage "
            f"{parsed.storage} encodes {storage.aux}/{storage.final}; {REEXTRACT}"
        )
    return {
        "verifier": parsed.verifier,
        "layer_ids": tuple(parsed.layer_ids),
        "hidden_size": parsed.hidden_size,
        "tokenizer_sha256": parsed.tokenizer_sha256,
        "dtype": parsed.dtype,
        "storage": parsed.storage,
    }


def index_entries(path: Path, index: bytes, records: tuple[int, int]) -> list[IndexEntry]:
    """A shard index's entries, each validated, lying back to back over `records` (start, end): the writer's
    layout, so that no entry points outside the file, into the header or index, or into another record."""
    try:
        entries = _INDEX.validate_python(_json(path, index, "index"))["samples"]
    except ValidationError as exc:
        raise ShardError(f"{path}: shard index: {field_problem(exc)}; {REEXTRACT}") from None
    start, end = records
    seen: set[str] = set()
    for position, entry in enumerate(entries):
        where = f"{path}: shard index: sample {position} ({entry['id']})"
        if entry["offset"] != start:
            raise ShardError(
                f"{where}: offset {entry['offset']}, expected {start} (records lie back to back between the header "
                f"and the index at {end}); {REEXTRACT}"
            )
        if entry["length"] < RECORD_HEAD.size:
            raise ShardError(f"{where}: length {entry['length']} is shorter than a record's head; {REEXTRACT}")
        if entry["loss_tokens"] > entry["tokens"]:
            raise ShardError(f"{where}: {entry['loss_tokens']} loss tokens of {entry['tokens']} tokens; {REEXTRACT}")
        if entry["id"] in seen:
            raise ShardError(f"{where}: the id appears twice; {REEXTRACT}")
        seen.add(entry["id"])
        start += entry["length"]
    if start != end:
        raise ShardError(
            f"{path}: shard index: the records end at byte {start}, the index starts at {end}; {REEXTRACT}"
        )
    return entries


def hidden_index(path: Path, data: object) -> HiddenIndex:
    """data/hidden/index.json (`write_index`), validated: its shard names stay inside their split's directory."""
    try:
        return _HIDDEN_INDEX.validate_python(data)
    except ValidationError as exc:
        raise Eagle3Error(f"{path}: {field_problem(exc)}; rerun `eagle3 extract` to rewrite it") from None


@dataclass(frozen=True)
class Section:
    name: str
    data: memoryview
    size: int  # its bytes once decoded
    compressed: bool


def section_sizes(storage: StorageName, layers: int, tokens: int, width: int) -> list[tuple[str, bool, int]]:
    """(name, zstd-compressed, bytes once decoded) of a record's six sections, in the order of the layout."""
    sizes = [("input ids", True, 4 * tokens), ("loss mask", True, -(-tokens // 8))]
    for role, count in (("aux", layers - 1), ("final", 1)):
        values = count * tokens * width
        if getattr(STORAGES[storage], role) == "bf16":
            sizes += [(f"{role} high bytes", True, values), (f"{role} low bytes", False, values)]
        else:
            sizes += [(f"{role} scales", False, 4 * count * tokens), (f"{role} codes", True, values)]
    return sizes


def record_sections(
    record, storage: StorageName, where: str, shape: tuple[int, int, int] | None
) -> tuple[tuple[int, int, int], list[Section]]:
    """A record's (layers, tokens, width) and sections, checked before anything is decoded: its head against
    `shape` (what the shard's header and index declare), the raw sections against the sizes the head implies,
    the section lengths against the record's."""
    if len(record) < RECORD_HEAD.size:
        raise ShardError(f"{where}: {len(record)} bytes, shorter than a record's head; {REEXTRACT}")
    tokens, layers, width, *lengths = RECORD_HEAD.unpack_from(record)
    if shape is not None:
        sources = (("layers", "the header"), ("tokens", "its index entry"), ("hidden size", "the header"))
        for (name, source), said, declared in zip(sources, (layers, tokens, width), shape, strict=True):
            if said != declared:
                raise ShardError(f"{where}: the record's head has {name} {said}, {source} {declared}; {REEXTRACT}")
    if tokens < 1 or layers < 2 or width < 1:
        raise ShardError(f"{where}: the record's head says {layers} layers x {tokens} tokens x {width}; {REEXTRACT}")
    if RECORD_HEAD.size + sum(lengths) != len(record):
        raise ShardError(
            f"{where}: the record's sections add up to {RECORD_HEAD.size + sum(lengths)} bytes, the record is "
            f"{len(record)}; {REEXTRACT}"
        )
    view, offset, sections = memoryview(record), RECORD_HEAD.size, []
    for (name, compressed, size), length in zip(section_sizes(storage, layers, tokens, width), lengths, strict=True):
        data = view[offset : offset + length]
        if not compressed and length != size:
            raise ShardError(f"{where}: {name} section of {length} bytes, expected {size}; {REEXTRACT}")
        if compressed:
            _check_frame(name, data, size, where)
        sections.append(Section(name, data, size, compressed))
        offset += length
    return (layers, tokens, width), sections


def _check_frame(name: str, data: memoryview, size: int, where: str) -> None:
    """A zstd section's frame header must declare exactly the size expected: zstandard allocates what a frame
    declares, so this (read from the header alone) is what bounds the memory a decompression takes."""
    try:
        declared = zstandard.frame_content_size(data)
    except zstandard.ZstdError as exc:
        raise ShardError(f"{where}: {name} section is not a zstd frame ({exc}); {REEXTRACT}") from None
    if declared != size:
        said = "no size" if declared < 0 else f"{declared} bytes"
        raise ShardError(f"{where}: {name} section declares {said} decompressed, expected {size}; {REEXTRACT}")


def inflated(section: Section, decompressor, where: str):
    """A section's bytes: a raw one as stored, a zstd one (its frame's declared size already checked)
    decompressed, which must then be one whole frame of exactly that size."""
    if not section.compressed:
        return section.data
    try:
        data = decompressor.decompress(section.data, max_output_size=section.size, allow_extra_data=False)
    except zstandard.ZstdError as exc:
        raise ShardError(f"{where}: {section.name} section does not decompress ({exc}); {REEXTRACT}") from None
    if len(data) != section.size:
        raise ShardError(
            f"{where}: {section.name} section decompressed to {len(data)} bytes, not {section.size}; {REEXTRACT}"
        )
    return data
