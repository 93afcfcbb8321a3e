"""Hidden-state shards: many samples per file, compressed, checksummed, random access, no pickle.

(Longer than most modules on purpose: the spec, the codec, the writer, the checked reader and the dataset
that reads them are one format; apart, a change to the layout could update one side and not the other. The
checks on what an untrusted shard declares are eagle3/formats/shard_checks.py: they follow this layout.)

File layout (all integers little-endian)::

    prefix   8s magic b"EAGLE3SH" | u16 format version | u16 reserved | u32 header length
             | u64 xxh3 of the prefix's first 16 bytes and the header
    header   UTF-8 JSON: format, version, verifier, layer_ids, hidden_size, dtype, storage, tokenizer_sha256, codec
    records  one per sample, back to back, each decodable on its own
    index    UTF-8 JSON: {"samples": [{id, offset, length, tokens, loss_tokens, xxh3}]}
    footer   u64 index offset | u64 index length | u64 xxh3 of the index | 8s b"E3SHEND1"

A record is a fixed 36-byte head (u32 tokens, layers, hidden, then the byte
lengths of its six sections) and six sections: input ids (int32, zstd), loss
mask (bit-packed, zstd), then two for the aux layers (all but the last of
`layer_ids`: the draft's input) and two for the final layer (the training
targets), each pair as the header's `storage` says for that role:

- `bf16`: lossless, the bf16 states split into byte planes: the high bytes
  (sign + 7 exponent bits) zstd-compressed, the low bytes (mantissa) raw.
- `e4m3` / `e5m2`: 8-bit floats (3 or 2 mantissa bits) with one fp32 scale
  per layer and token (its largest magnitude / the format's largest finite
  value, 448 or 57,344): the scales raw, then the codes zstd-compressed. A
  value comes back within half a step of its format (1/16 or 1/8 of itself)
  plus half the subnormal step (scale x 2^-10 or 2^-17), then rounded to bf16.

`storage` names the pair for the file (the table in eagle3/formats/storage.py):
`bf16-lossless` (both roles bf16), `fp8-aux` (aux e4m3, final bf16), `fp8`
(both e4m3), `fp8-compact` (aux e5m2, final e4m3). Hidden states
are stored layer-major, [layers, tokens, hidden], in `layer_ids` order, and
always read back as bf16.

Why this codec (measured on SmolLM2's real aux + final states,
benchmarks/storage.py): the high plane shrinks ~3x, the low plane not at all,
so zstd on it only costs time; zstd level 1 compresses the high plane *better*
than level 3 (1.48x vs 1.43x overall) and faster; a channel-major layout gains
nothing (1.481x); a 2^10-entry hash table instead of level 1's 2^14 keeps the
ratio and compresses ~1.5-2x faster (see `_HASH_LOG`). Any zstd parameters
decode the same way, so the codec's `level`/`hash_log` in the header are
informative only.

Every record's xxh3-64 is in the index and is checked on every read, before
decompression; the index and the header have their own. A shard is written to
`.<name>.partial` and renamed only after its footer is on disk, so a file with
the final name is always complete: a truncated or damaged one is reported naming
the shard (and the sample), never silently read.

Shards come from remotes, so the reader takes them as untrusted data: before a
byte is decoded, the header and the index are validated field by field, the
records must lie back to back between them, a record's head must agree with its
index entry and the header, and its sections with its head, each zstd one a
single frame declaring exactly the size it decodes to. What a read allocates is
thus bounded by the record's length and the states its shard declares for it;
token ids are non-negative and the mask holds the index's loss tokens.

The directory (data/hidden/)::

    run.json                         the run key and settings the shards were made with (eagle3/resume.py)
    <split>/shard-PPPPP-NNN.e3sh     the NNNth shard planned from synthetic part PPPPP (`shard_name`)
    <split>/part-PPPPP.done.json     part PPPPP's shards all written (eagle3/formats/extracted_parts.py)
    environments/<id>.json           which environment made which shards (eagle3/environment.py)
    index.json                       written last: layer_ids, hidden_size and per split every shard with its
                                     samples, tokens, loss tokens and bytes (`write_index` / `split_shards`)
"""

import contextlib
import json
import os
import struct
import threading
from collections import OrderedDict, deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xxhash
import zstandard

from eagle3.errors import Eagle3Error
from eagle3.files import open_held, partial_path, read_json, space_for, write_json
from eagle3.formats.shard_checks import (
    RECORD_HEAD,
    REEXTRACT,
    HiddenIndex,
    Section,
    ShardError,
    header_fields,
    hidden_index,
    index_entries,
    inflated,
    record_sections,
)
from eagle3.formats.storage import DEFAULT_STORAGE, STORAGES, StorageName
from eagle3.paths import HIDDEN_DIR, HIDDEN_INDEX

# Version 3: the header's checksum in the prefix.
MAGIC, END_MAGIC, VERSION = b"EAGLE3SH", b"E3SHEND1", 3
SUFFIX = ".e3sh"
_PREFIX = struct.Struct("<8sHHIQ")
_CHECKED_PREFIX = 16  # the prefix's bytes before its checksum, which covers them and the header
_FOOTER = struct.Struct("<QQQ8s")
# A real header is a few hundred bytes; past this a length field is damage, not a header to read.
_MAX_HEADER = 2**16

# The 8-bit encodings: their dtype and largest finite value (a token's largest magnitude maps to it).
FP8 = {"e4m3": (torch.float8_e4m3fn, 448.0), "e5m2": (torch.float8_e5m2, 57344.0)}


@dataclass(frozen=True)
class ShardMeta:
    verifier: str
    layer_ids: tuple[int, ...]
    hidden_size: int
    tokenizer_sha256: str
    dtype: str = "bfloat16"
    storage: StorageName = DEFAULT_STORAGE


@dataclass
class Sample:
    sample_id: str
    input_ids: torch.Tensor  # int64 [tokens]
    loss_mask: torch.Tensor  # bool [tokens]
    hidden: torch.Tensor  # bfloat16 [layers, tokens, hidden]


# zstd's hash table at 2^10 entries instead of level 1's 2^14: the high plane's matches are short-range, so the
# ratio stays the same while the table stays in L1 and compression runs faster (benchmarks/storage.py).
_HASH_LOG = 10
_compressors = threading.local()


def _zstd_params(level: int) -> zstandard.ZstdCompressionParameters:
    default = zstandard.ZstdCompressionParameters.from_level(level)
    return zstandard.ZstdCompressionParameters.from_level(level, hash_log=min(default.hash_log, _HASH_LOG))


def _compressor(level: int) -> zstandard.ZstdCompressor:
    # One compressor per thread and level: creating one per sample costs its tables' allocation every time.
    cache = _compressors.__dict__.setdefault("by_level", {})
    if level not in cache:
        cache[level] = zstandard.ZstdCompressor(compression_params=_zstd_params(level))
    return cache[level]


def _encode_role(states: torch.Tensor, encoding: str, compressor) -> list[Any]:
    """One role's states [layers, tokens, hidden] as its two sections."""
    if encoding == "bf16":
        # bf16 bit patterns as int16: the arithmetic shift's sign extension is cut off by the uint8 cast.
        bits = states.to(torch.bfloat16).contiguous().view(torch.int16).reshape(-1)
        return [compressor.compress((bits >> 8).to(torch.uint8).numpy()), bits.to(torch.uint8).numpy().data]
    dtype, largest_code = FP8[encoding]
    values = states.float()
    largest = values.abs().amax(-1, keepdim=True)
    scales = torch.where(largest > 0, largest / largest_code, torch.ones_like(largest))
    codes = (values / scales).to(dtype).view(torch.uint8)
    scale_bytes = scales.reshape(-1).numpy().astype("<f4").view(np.uint8)
    return [scale_bytes.data, compressor.compress(codes.reshape(-1).numpy())]


def encode_sample(
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    hidden: torch.Tensor,
    level: int = 1,
    storage: StorageName = DEFAULT_STORAGE,
) -> tuple[list[Any], int, int]:
    """A record as the buffers to write back to back (no joined copy), its total length and its xxh3-64."""
    layers, tokens, width = hidden.shape
    if input_ids.shape != (tokens,) or loss_mask.shape != (tokens,):
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)} / loss_mask {tuple(loss_mask.shape)} do not match hidden "
            f"{tuple(hidden.shape)}"
        )
    compressor = _compressor(level)
    aux, final = STORAGES[storage].aux, STORAGES[storage].final
    sections = [
        compressor.compress(input_ids.to(torch.int32).numpy().astype("<i4", copy=False).data),
        compressor.compress(np.packbits(loss_mask.numpy().astype(bool)).data),
        *_encode_role(hidden[:-1], aux, compressor),
        *_encode_role(hidden[-1:], final, compressor),
    ]
    buffers = [RECORD_HEAD.pack(tokens, layers, width, *(len(memoryview(s)) for s in sections)), *sections]
    digest = xxhash.xxh3_64()
    for buffer in buffers:
        digest.update(buffer)
    return buffers, sum(len(memoryview(b)) for b in buffers), digest.intdigest()


def _decode_tokens(decompressor, tokens: int, sections: list[Section], where: str) -> tuple[torch.Tensor, torch.Tensor]:
    ids = np.frombuffer(inflated(sections[0], decompressor, where), dtype="<i4")
    if int(ids.min()) < 0:
        raise ShardError(f"{where}: negative token id {int(ids.min())}; {REEXTRACT}")
    mask = np.frombuffer(inflated(sections[1], decompressor, where), dtype=np.uint8)
    return torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(np.unpackbits(mask, count=tokens).astype(bool))


def _decode_role(sections: list[Section], encoding: str, out: torch.Tensor, decompressor, where: str) -> None:
    """One role's two sections decoded into `out`, its slice of the sample's states [layers, tokens, hidden]."""
    first, second = sections
    if encoding == "bf16":
        planes = out.view(torch.int16).numpy().view(np.uint8).reshape(-1, 2)  # little-endian: low byte first
        planes[:, 1] = np.frombuffer(inflated(first, decompressor, where), dtype=np.uint8)
        planes[:, 0] = np.frombuffer(second.data, dtype=np.uint8)
        return
    layers, tokens, _ = out.shape
    scales = torch.from_numpy(np.frombuffer(first.data, dtype="<f4").astype(np.float32)).reshape(layers, tokens, 1)
    # The checksum proves the bytes are what was written, not that a writer wrote sane scales.
    if not bool(torch.isfinite(scales).all() and (scales > 0).all()):
        raise ShardError(f"{where}: invalid 8-bit scales (not finite and positive); rerun `eagle3 extract`")
    codes = np.frombuffer(inflated(second, decompressor, where), dtype=np.uint8).reshape(out.shape)
    for layer in range(layers):
        # A layer at a time: the whole role in float32 would hold twice the size of its bf16 states (and a
        # writable copy of its codes, which torch needs, as much again).
        values = torch.from_numpy(codes[layer].copy()).view(FP8[encoding][0])
        out[layer] = values.float().mul_(scales[layer])


def decode_sample(
    record, storage: StorageName = DEFAULT_STORAGE, where: str = "record", shape: tuple[int, int, int] | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A record's (input ids, loss mask, hidden states), its layout checked first; `shape`: the (layers, tokens,
    width) its shard declares for it."""
    (layers, tokens, width), sections = record_sections(record, storage, where, shape)
    decompressor = zstandard.ZstdDecompressor()
    input_ids, loss_mask = _decode_tokens(decompressor, tokens, sections, where)
    # Both roles decode in place: joining them afterwards would hold the states twice.
    hidden = torch.empty((layers, tokens, width), dtype=torch.bfloat16)
    _decode_role(sections[2:4], STORAGES[storage].aux, hidden[:-1], decompressor, where)
    _decode_role(sections[4:6], STORAGES[storage].final, hidden[-1:], decompressor, where)
    return input_ids, loss_mask, hidden


class ShardWriter:
    """Streams samples into one shard. Compression runs on `threads` threads (zstd releases the GIL) with at most
    2 x threads samples in flight, so memory stays bounded whatever the shard size."""

    def __init__(self, path: Path, meta: ShardMeta, level: int = 1, threads: int = 2):
        if meta.storage not in STORAGES:
            raise ValueError(f"storage {meta.storage!r}: expected one of {', '.join(STORAGES)}")
        self.path, self.meta, self.level = Path(path), meta, level
        self.partial = partial_path(self.path)
        self.handle = open_held(self.partial)  # other ranks' cleanups leave it alone
        codec = {
            "aux": STORAGES[meta.storage].aux,
            "final": STORAGES[meta.storage].final,
            "level": level,
            "hash_log": _zstd_params(level).hash_log,
        }
        header = json.dumps(
            {"format": "eagle3-shard", "version": VERSION, **asdict(meta), "codec": codec}, sort_keys=True
        ).encode()
        fields = (MAGIC, VERSION, 0, len(header))
        checksum = xxhash.xxh3_64_intdigest(_PREFIX.pack(*fields, 0)[:_CHECKED_PREFIX] + header)
        self.handle.write(_PREFIX.pack(*fields, checksum) + header)
        self.offset = _PREFIX.size + len(header)
        self.pool = ThreadPoolExecutor(max_workers=threads)
        self.in_flight: deque[tuple[str, int, int, Future]] = deque()
        self.window = 2 * threads
        self.index: list[dict[str, Any]] = []

    def add(self, sample_id: str, input_ids: torch.Tensor, loss_mask: torch.Tensor, hidden: torch.Tensor) -> None:
        if hidden.shape[0] != len(self.meta.layer_ids) or hidden.shape[2] != self.meta.hidden_size:
            raise ValueError(
                f"hidden {tuple(hidden.shape)} does not match layers {self.meta.layer_ids} x hidden "
                f"{self.meta.hidden_size}"
            )
        future = self.pool.submit(encode_sample, input_ids, loss_mask, hidden, self.level, self.meta.storage)
        self.in_flight.append((sample_id, len(input_ids), int(loss_mask.sum()), future))
        while len(self.in_flight) > self.window:
            self._drain_one()

    def _drain_one(self) -> None:
        sample_id, tokens, loss_tokens, future = self.in_flight.popleft()
        buffers, length, checksum = future.result()
        self.index.append(
            {
                "id": sample_id,
                "offset": self.offset,
                "length": length,
                "tokens": tokens,
                "loss_tokens": loss_tokens,
                "xxh3": checksum,
            }
        )
        with space_for(self.path, length):
            for buffer in buffers:
                self.handle.write(buffer)
        self.offset += length

    def close(self) -> Path:
        while self.in_flight:
            self._drain_one()
        self.pool.shutdown()
        index = json.dumps({"samples": self.index}, sort_keys=True).encode()
        footer = index + _FOOTER.pack(self.offset, len(index), xxhash.xxh3_64_intdigest(index), END_MAGIC)
        with space_for(self.path, len(footer)):
            self.handle.write(footer)
            self.handle.flush()
            os.fsync(self.handle.fileno())
        os.replace(self.partial, self.path)
        self.handle.close()
        return self.path

    def abort(self) -> None:
        self.pool.shutdown(cancel_futures=True)
        self.partial.unlink(missing_ok=True)
        # Closing flushes what is still buffered, which fails again on a full disk: the file is gone already.
        with contextlib.suppress(OSError):
            self.handle.close()

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()


class ShardReader:
    """O(1) random access to one shard's samples; every read is checksum-verified and its layout checked against
    the header and index (both validated on opening) before anything is decoded. With `vocab_size`, every token
    id must be below it."""

    def __init__(self, path: Path, vocab_size: int | None = None):
        self.path, self.vocab_size = Path(path), vocab_size
        try:
            self.handle = open(self.path, "rb")
        except OSError as exc:
            raise ShardError(f"{self.path}: cannot open shard ({exc.strerror})") from None
        size = os.fstat(self.handle.fileno()).st_size
        prefix = self.handle.read(_PREFIX.size)
        # The magic and the version come first in every format version, so an older shard is told apart.
        if len(prefix) < len(MAGIC) + 2 or prefix[: len(MAGIC)] != MAGIC:
            raise ShardError(f"{self.path}: not an eagle3 shard (bad magic); {REEXTRACT}")
        (version,) = struct.unpack_from("<H", prefix, len(MAGIC))
        if version != VERSION:
            raise ShardError(
                f"{self.path}: shard format version {version}, this eagle3 reads {VERSION}; rerun `eagle3 extract`"
            )
        if len(prefix) < _PREFIX.size:
            raise self._truncated()
        _, _, _, header_length, header_checksum = _PREFIX.unpack(prefix)
        if header_length > _MAX_HEADER:
            raise ShardError(
                f"{self.path}: header length {header_length} bytes, more than a shard header's {_MAX_HEADER}: the "
                f"shard is damaged; {REEXTRACT}"
            )
        records_start = _PREFIX.size + header_length
        if size < records_start + _FOOTER.size:
            raise self._truncated()
        header = self.handle.read(header_length)
        if xxhash.xxh3_64_intdigest(prefix[:_CHECKED_PREFIX] + header) != header_checksum:
            raise ShardError(f"{self.path}: header checksum mismatch: the shard is damaged; {REEXTRACT}")
        self.meta = ShardMeta(**header_fields(self.path, header, version))
        self.handle.seek(size - _FOOTER.size)
        offset, length, checksum, end = _FOOTER.unpack(self.handle.read(_FOOTER.size))
        if end != END_MAGIC or offset + length + _FOOTER.size != size:
            raise self._truncated()
        if offset < records_start:
            raise ShardError(
                f"{self.path}: footer: the index at byte {offset} overlaps the header, which ends at {records_start}; "
                f"{REEXTRACT}"
            )
        self.handle.seek(offset)
        index = self.handle.read(length)
        if xxhash.xxh3_64_intdigest(index) != checksum:
            raise ShardError(f"{self.path}: index checksum mismatch: the shard is damaged; {REEXTRACT}")
        self.entries = index_entries(self.path, index, (records_start, offset))
        self.position = {entry["id"]: i for i, entry in enumerate(self.entries)}

    def _truncated(self) -> ShardError:
        return ShardError(f"{self.path}: truncated or unfinished shard (no valid end marker); {REEXTRACT}")

    def __len__(self) -> int:
        return len(self.entries)

    def _where(self, position: int) -> str:
        return f"{self.path}: sample {position} ({self.entries[position]['id']})"

    def _shape(self, position: int) -> tuple[int, int, int]:
        """The (layers, tokens, width) the header and the index declare for a record."""
        return len(self.meta.layer_ids), self.entries[position]["tokens"], self.meta.hidden_size

    def read(self, position: int) -> Sample:
        entry, where = self.entries[position], self._where(position)
        record = self._checked(position, os.pread(self.handle.fileno(), entry["length"], entry["offset"]))
        input_ids, loss_mask, hidden = decode_sample(record, self.meta.storage, where, self._shape(position))
        self._check_tokens(position, input_ids, loss_mask)
        return Sample(entry["id"], input_ids, loss_mask, hidden)

    def _checked(self, position: int, record):
        entry, where = self.entries[position], self._where(position)
        if len(record) != entry["length"]:
            raise ShardError(
                f"{where}: record cut short ({len(record)} of {entry['length']} bytes): the shard is truncated"
            )
        if xxhash.xxh3_64_intdigest(record) != entry["xxh3"]:
            raise ShardError(f"{where}: checksum mismatch: the shard is damaged; {REEXTRACT}")
        return record

    def _check_tokens(self, position: int, input_ids: torch.Tensor, loss_mask: torch.Tensor) -> None:
        declared, where = self.entries[position]["loss_tokens"], self._where(position)
        if int(loss_mask.sum()) != declared:
            raise ShardError(
                f"{where}: the loss mask holds {int(loss_mask.sum())} tokens, the index {declared}; {REEXTRACT}"
            )
        if self.vocab_size is not None and int(input_ids.max()) >= self.vocab_size:
            raise ShardError(
                f"{where}: token id {int(input_ids.max())} >= the verifier's vocab size {self.vocab_size}; rerun "
                "`eagle3 extract` for this verifier"
            )

    def close(self) -> None:
        self.handle.close()


def check_meta(path: Path, meta: ShardMeta, expected: dict[str, Any]) -> None:
    """One error naming every field where a shard disagrees with what the caller (params, verifier) expects."""
    actual = asdict(meta)
    wrong = [
        f"{key} is {actual[key]!r}, expected {value!r}"
        for key, value in expected.items()
        if actual[key] != (tuple(value) if isinstance(value, list) else value)
    ]
    if wrong:
        raise ShardError(
            f"{path}: made for other settings: {'; '.join(wrong)}; rerun `eagle3 extract` for these params"
        )


class HiddenStateDataset(torch.utils.data.Dataset):
    """Every sample of a list of shards, by global position. Files are opened lazily in each DataLoader worker,
    so workers decompress in parallel without sharing file handles, and a process opens only the shards its
    samples are in, at most OPEN_SHARDS at a time (a hero run has thousands of shards; the usual limit on open
    files is 1,024 per process). With `vocab_size`, every token id must be below it (the readers check)."""

    OPEN_SHARDS = 32

    def __init__(self, paths: list[Path], expected: dict[str, Any] | None = None, vocab_size: int | None = None):
        self.paths, self.vocab_size = [Path(p) for p in paths], vocab_size
        self.offsets: list[int] = []
        lengths: list[int] = []
        for path in self.paths:
            reader = ShardReader(path)
            if expected:
                check_meta(path, reader.meta, expected)
            self.offsets.append(len(lengths))
            lengths += [entry["tokens"] for entry in reader.entries]
            reader.close()
        self.total = len(lengths)
        # Tokens per sample, by global position: what batching by length and by token budget needs.
        self.lengths = torch.tensor(lengths, dtype=torch.int64)
        self._readers: OrderedDict[int, ShardReader] = OrderedDict()
        self._pid = os.getpid()

    def __len__(self) -> int:
        return self.total

    def _reader(self, shard: int) -> ShardReader:
        if self._pid != os.getpid():  # a forked worker must not reuse the parent's file handles
            self._readers, self._pid = OrderedDict(), os.getpid()
        if shard in self._readers:
            self._readers.move_to_end(shard)
        else:
            if len(self._readers) >= self.OPEN_SHARDS:
                self._readers.popitem(last=False)[1].close()
            self._readers[shard] = ShardReader(self.paths[shard], self.vocab_size)
        return self._readers[shard]

    def __getitem__(self, position: int) -> dict[str, Any]:
        if not 0 <= position < self.total:
            raise IndexError(position)
        shard = int(np.searchsorted(self.offsets, position, side="right")) - 1
        sample = self._reader(shard).read(position - self.offsets[shard])
        return {
            "id": sample.sample_id,
            "input_ids": sample.input_ids,
            "loss_mask": sample.loss_mask,
            "hidden": sample.hidden,
        }


def shard_name(part: int, number: int) -> str:
    """The `number`th shard planned from synthetic part `part` (extract plans each part on its own)."""
    return f"shard-{part:05d}-{number:03d}{SUFFIX}"


def write_index(out: Path, meta: ShardMeta, shards: dict[str, list[Path]]) -> dict[str, int]:
    """index.json over the finished shards of each split (in order); returns the totals over all of them."""
    index: dict[str, list[dict[str, Any]]] = {}
    totals = {"samples": 0, "tokens": 0, "loss_tokens": 0, "bytes": 0}
    for split, paths in shards.items():
        for path in paths:
            reader = ShardReader(path)
            entry: dict[str, Any] = {
                "shard": path.name,
                "samples": len(reader),
                "tokens": sum(e["tokens"] for e in reader.entries),
                "loss_tokens": sum(e["loss_tokens"] for e in reader.entries),
                "bytes": path.stat().st_size,
            }
            reader.close()
            index.setdefault(split, []).append(entry)
            for key in totals:
                totals[key] += entry[key]
    write_json(
        out / HIDDEN_INDEX.name, {"layer_ids": list(meta.layer_ids), "hidden_size": meta.hidden_size, "splits": index}
    )
    return totals


def read_index(root: Path) -> HiddenIndex:
    path = root / HIDDEN_INDEX
    return hidden_index(path, read_json(path, "run `dvc repro extract` (or `eagle3 extract`) first"))


def split_shards(root: Path, split: str = "train") -> list[Path]:
    """The extract stage's shards of one split, in order (its index.json lists them)."""
    listed = read_index(root)["splits"].get(split, [])
    if not listed:
        raise Eagle3Error(
            f"{root / HIDDEN_INDEX}: no {split!r} shards; add {split!r} to extract.splits and rerun `eagle3 extract`"
        )
    return [root / HIDDEN_DIR / split / entry["shard"] for entry in listed]
