"""Hidden-state shards: many samples per file, compressed, checksummed, random access, no pickle.

(Longer than most modules on purpose: the spec, the codec, the writer, the checked reader and the dataset
that reads them are one format; apart, a change to the layout could update one side and not the other.)

File layout (all integers little-endian)::

    prefix   8s magic b"EAGLE3SH" | u16 format version | u16 reserved | u32 header length
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
decompression; the index has its own. A shard is written to `.<name>.partial`
and renamed only after its footer is on disk, so a file with the final name is
always complete: a truncated or damaged one is reported naming the shard (and
the sample), never silently read.

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
import math
import mmap
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
from eagle3.files import partial_path, read_json, write_json
from eagle3.formats.storage import DEFAULT_STORAGE, STORAGES
from eagle3.paths import HIDDEN_DIR, HIDDEN_INDEX

MAGIC, END_MAGIC, VERSION = b"EAGLE3SH", b"E3SHEND1", 2
SUFFIX = ".e3sh"
_PREFIX = struct.Struct("<8sHHI")
_FOOTER = struct.Struct("<QQQ8s")
_RECORD = struct.Struct("<9I")

# The 8-bit encodings: their dtype and largest finite value (a token's largest magnitude maps to it).
FP8 = {"e4m3": (torch.float8_e4m3fn, 448.0), "e5m2": (torch.float8_e5m2, 57344.0)}


class ShardError(Eagle3Error):
    """A shard that cannot be trusted: damaged, truncated, or made for another verifier or layout."""


@dataclass(frozen=True)
class ShardMeta:
    verifier: str
    layer_ids: tuple[int, ...]
    hidden_size: int
    tokenizer_sha256: str
    dtype: str = "bfloat16"
    storage: str = DEFAULT_STORAGE


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
        return [compressor.compress((bits >> 8).to(torch.uint8).numpy()), memoryview(bits.to(torch.uint8).numpy())]
    dtype, largest_code = FP8[encoding]
    values = states.float()
    largest = values.abs().amax(-1, keepdim=True)
    scales = torch.where(largest > 0, largest / largest_code, torch.ones_like(largest))
    codes = (values / scales).to(dtype).view(torch.uint8)
    scale_bytes = scales.reshape(-1).numpy().astype("<f4").view(np.uint8)
    return [memoryview(scale_bytes), compressor.compress(codes.reshape(-1).numpy())]


def encode_sample(
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    hidden: torch.Tensor,
    level: int = 1,
    storage: str = DEFAULT_STORAGE,
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
        compressor.compress(input_ids.to(torch.int32).numpy().astype("<i4", copy=False)),
        compressor.compress(np.packbits(loss_mask.numpy().astype(bool))),
        *_encode_role(hidden[:-1], aux, compressor),
        *_encode_role(hidden[-1:], final, compressor),
    ]
    buffers = [_RECORD.pack(tokens, layers, width, *(len(memoryview(s)) for s in sections)), *sections]
    digest = xxhash.xxh3_64()
    for buffer in buffers:
        digest.update(buffer)
    return buffers, sum(len(memoryview(b)) for b in buffers), digest.intdigest()


def _sections(record: bytes) -> tuple[int, int, int, list[memoryview]]:
    tokens, layers, width, *lengths = _RECORD.unpack_from(record)
    view, offset, sections = memoryview(record), _RECORD.size, []
    for length in lengths:
        sections.append(view[offset : offset + length])
        offset += length
    return tokens, layers, width, sections


def _decode_tokens(decompressor, tokens: int, sections: list[memoryview]) -> tuple[torch.Tensor, torch.Tensor]:
    ids, mask = (decompressor.decompress(section) for section in sections[:2])
    input_ids = torch.from_numpy(np.frombuffer(ids, dtype="<i4").astype(np.int64))
    loss_mask = torch.from_numpy(np.unpackbits(np.frombuffer(mask, dtype=np.uint8), count=tokens).astype(bool))
    return input_ids, loss_mask


def _decode_role(sections, encoding: str, shape: tuple[int, int, int], decompressor, where: str) -> torch.Tensor:
    first, second = sections
    if encoding == "bf16":
        pairs = np.empty((math.prod(shape), 2), dtype=np.uint8)
        pairs[:, 1] = np.frombuffer(decompressor.decompress(first), dtype=np.uint8)
        pairs[:, 0] = np.frombuffer(second, dtype=np.uint8)
        return torch.from_numpy(pairs.view(np.uint16).reshape(shape)).view(torch.bfloat16)
    scales = torch.from_numpy(np.frombuffer(first, dtype="<f4").astype(np.float32))
    # The checksum proves the bytes are what was written, not that a writer wrote sane scales.
    if len(scales) != shape[0] * shape[1] or not bool(torch.isfinite(scales).all() and (scales > 0).all()):
        raise ShardError(f"{where}: invalid 8-bit scales (not finite and positive); rerun `eagle3 extract`")
    codes = torch.from_numpy(np.frombuffer(decompressor.decompress(second), dtype=np.uint8).copy())
    values = codes.view(FP8[encoding][0]).float().reshape(shape) * scales.reshape(shape[0], shape[1], 1)
    return values.to(torch.bfloat16)


def decode_sample(
    record: bytes, storage: str = DEFAULT_STORAGE, where: str = "record"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    tokens, layers, width, sections = _sections(record)
    decompressor = zstandard.ZstdDecompressor()
    input_ids, loss_mask = _decode_tokens(decompressor, tokens, sections)
    aux, final = STORAGES[storage].aux, STORAGES[storage].final
    hidden = torch.cat(
        [
            _decode_role(sections[2:4], aux, (layers - 1, tokens, width), decompressor, where),
            _decode_role(sections[4:6], final, (1, tokens, width), decompressor, where),
        ]
    )
    return input_ids, loss_mask, hidden


def decode_tokens(record: bytes, decompressor=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Only the input ids and the loss mask: the hidden-state planes (all but a few bytes per token) stay
    compressed."""
    tokens, _, _, sections = _sections(record)
    return _decode_tokens(decompressor or zstandard.ZstdDecompressor(), tokens, sections)


class ShardWriter:
    """Streams samples into one shard. Compression runs on `threads` threads (zstd releases the GIL) with at most
    2 x threads samples in flight, so memory stays bounded whatever the shard size."""

    def __init__(self, path: Path, meta: ShardMeta, level: int = 1, threads: int = 2):
        if meta.storage not in STORAGES:
            raise ValueError(f"storage {meta.storage!r}: expected one of {', '.join(STORAGES)}")
        self.path, self.meta, self.level = Path(path), meta, level
        self.partial = partial_path(self.path)
        self.handle = open(self.partial, "wb")
        codec = {
            "aux": STORAGES[meta.storage].aux,
            "final": STORAGES[meta.storage].final,
            "level": level,
            "hash_log": _zstd_params(level).hash_log,
        }
        header = json.dumps(
            {"format": "eagle3-shard", "version": VERSION, **asdict(meta), "codec": codec}, sort_keys=True
        ).encode()
        self.handle.write(_PREFIX.pack(MAGIC, VERSION, 0, len(header)) + header)
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
        for buffer in buffers:
            self.handle.write(buffer)
        self.offset += length

    def close(self) -> Path:
        while self.in_flight:
            self._drain_one()
        self.pool.shutdown()
        index = json.dumps({"samples": self.index}, sort_keys=True).encode()
        self.handle.write(index + _FOOTER.pack(self.offset, len(index), xxhash.xxh3_64_intdigest(index), END_MAGIC))
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()
        os.replace(self.partial, self.path)
        return self.path

    def abort(self) -> None:
        self.pool.shutdown(cancel_futures=True)
        self.handle.close()
        self.partial.unlink(missing_ok=True)

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()


class ShardReader:
    """O(1) random access to one shard's samples; every read is checksum-verified."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            self.handle = open(self.path, "rb")
        except OSError as exc:
            raise ShardError(f"{self.path}: cannot open shard ({exc.strerror})") from None
        size = os.fstat(self.handle.fileno()).st_size
        prefix = self.handle.read(_PREFIX.size)
        if len(prefix) < _PREFIX.size or prefix[:8] != MAGIC:
            raise ShardError(f"{self.path}: not an eagle3 shard (bad magic); delete it and rerun `eagle3 extract`")
        _, version, _, header_length = _PREFIX.unpack(prefix)
        if version != VERSION:
            raise ShardError(
                f"{self.path}: shard format version {version}, this eagle3 reads {VERSION}; rerun `eagle3 extract`"
            )
        if size < _PREFIX.size + header_length + _FOOTER.size:
            raise self._truncated()
        try:
            header = json.loads(self.handle.read(header_length))
            fields = {key: header[key] for key in ShardMeta.__dataclass_fields__}
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError) as exc:
            raise ShardError(
                f"{self.path}: unreadable shard header ({exc}); delete it and rerun `eagle3 extract`"
            ) from None
        self.meta = ShardMeta(**{**fields, "layer_ids": tuple(fields["layer_ids"])})
        if self.meta.storage not in STORAGES:
            raise ShardError(f"{self.path}: unknown storage {self.meta.storage!r}; rerun `eagle3 extract`")
        self.handle.seek(size - _FOOTER.size)
        offset, length, checksum, end = _FOOTER.unpack(self.handle.read(_FOOTER.size))
        if end != END_MAGIC or offset + length + _FOOTER.size != size:
            raise self._truncated()
        self.handle.seek(offset)
        index = self.handle.read(length)
        if xxhash.xxh3_64_intdigest(index) != checksum:
            raise ShardError(
                f"{self.path}: index checksum mismatch: the shard is damaged; delete it and rerun `eagle3 extract`"
            )
        self.entries: list[dict[str, Any]] = json.loads(index)["samples"]
        self.position = {entry["id"]: i for i, entry in enumerate(self.entries)}
        self._mapped: memoryview | None = None

    def _truncated(self) -> ShardError:
        return ShardError(
            f"{self.path}: truncated or unfinished shard (no valid end marker); delete it and rerun `eagle3 extract`"
        )

    def __len__(self) -> int:
        return len(self.entries)

    def read(self, position: int) -> Sample:
        where = f"{self.path}: sample {position} ({self.entries[position]['id']})"
        input_ids, loss_mask, hidden = decode_sample(self._record(position), self.meta.storage, where)
        return Sample(self.entries[position]["id"], input_ids, loss_mask, hidden)

    def read_tokens(self, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(input ids, loss mask) of one sample, checksum-verified like `read`, without decoding its states. The
        record is checked in place through a memory map: only its token sections are ever copied."""
        if self._mapped is None:
            self._map = mmap.mmap(self.handle.fileno(), 0, access=mmap.ACCESS_READ)
            self._mapped = memoryview(self._map)
            self._decompressor = zstandard.ZstdDecompressor()
        entry = self.entries[position]
        record = self._mapped[entry["offset"] : entry["offset"] + entry["length"]]
        return decode_tokens(self._checked(position, record), self._decompressor)

    def _record(self, position: int) -> bytes:
        entry = self.entries[position]
        return self._checked(position, os.pread(self.handle.fileno(), entry["length"], entry["offset"]))

    def _checked(self, position: int, record):
        entry = self.entries[position]
        where = f"{self.path}: sample {position} ({entry['id']})"
        if len(record) != entry["length"]:
            raise ShardError(
                f"{where}: record cut short ({len(record)} of {entry['length']} bytes): the shard is truncated"
            )
        if xxhash.xxh3_64_intdigest(record) != entry["xxh3"]:
            raise ShardError(f"{where}: checksum mismatch: the shard is damaged; delete it and rerun `eagle3 extract`")
        return record

    def close(self) -> None:
        if self._mapped is not None:
            self._mapped.release()
            self._mapped = None
            # A record view still referenced (by the traceback of a checksum error being raised) keeps the map
            # open; it unmaps itself when that view goes.
            with contextlib.suppress(BufferError):
                self._map.close()
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
    files is 1,024 per process)."""

    OPEN_SHARDS = 32

    def __init__(self, paths: list[Path], expected: dict[str, Any] | None = None):
        self.paths = [Path(p) for p in paths]
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
            self._readers[shard] = ShardReader(self.paths[shard])
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
            entry = {
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


def read_index(root: Path) -> dict[str, Any]:
    return read_json(root / HIDDEN_INDEX, "run `dvc repro extract` (or `eagle3 extract`) first")


def split_shards(root: Path, split: str = "train") -> list[Path]:
    """The extract stage's shards of one split, in order (its index.json lists them)."""
    listed = read_index(root)["splits"].get(split, [])
    if not listed:
        raise Eagle3Error(
            f"{root / HIDDEN_INDEX}: no {split!r} shards; add {split!r} to extract.splits and rerun `eagle3 extract`"
        )
    return [root / HIDDEN_DIR / split / entry["shard"] for entry in listed]
