"""Shards as untrusted data (issue 33): crafted files whose every checksum is valid, and a seeded fuzz test.

Each hostile shard is built here by re-sealing a valid one (the header's, each record's and the index's checksums
recomputed), as a hostile or buggy writer would: what stops it is the validation, not the checksums. Memory is
measured as the tracemalloc peak (Python objects, bytes and numpy arrays) plus the torch allocations' peak
(eagle3/training/memory.py's PeakBytes), both reset before each read. (Longer than most modules: one crafted case
per field a shard declares, each with its expected line.)
"""

import json
import random
import struct
import time
import tracemalloc
from contextlib import contextmanager
from dataclasses import replace

import numpy as np
import pytest
import torch
import xxhash
import zstandard

from eagle3.formats.shard_checks import RECORD_HEAD
from eagle3.formats.shards import MAGIC, VERSION, ShardError, ShardMeta, ShardReader, ShardWriter
from eagle3.training.memory import PeakBytes

PREFIX, FOOTER = struct.Struct("<8sHHIQ"), struct.Struct("<QQQ8s")
META = ShardMeta(verifier="org/model", layer_ids=(2, 15, 27, 30), hidden_size=64, tokenizer_sha256="ab" * 32)
GIB = 2**30


def _sample(seed: int, tokens: int, vocab: int = 49152):
    generator = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(4, tokens, 64, generator=generator) * torch.logspace(-2, 2.5, 64)).to(torch.bfloat16)
    ids = torch.randint(0, vocab, (tokens,), generator=generator)
    return f"s{seed}", ids, torch.rand(tokens, generator=generator) > 0.4, hidden


SAMPLES = [_sample(seed, tokens) for seed, tokens in enumerate([7, 300, 1, 64])]
BIG = 1  # the 300-token sample: large enough that a read's fixed costs do not hide what it allocates


def _write(path, samples=SAMPLES, storage="bf16-lossless"):
    with ShardWriter(path, replace(META, storage=storage), threads=1) as writer:
        for sample in samples:
            writer.add(*sample)
    return path


def _parts(path):
    """(header bytes, records, index entries) of a shard."""
    data = path.read_bytes()
    header_length = PREFIX.unpack_from(data)[3]
    header = data[PREFIX.size : PREFIX.size + header_length]
    offset, length, _, _ = FOOTER.unpack_from(data, len(data) - FOOTER.size)
    entries = json.loads(data[offset : offset + length])["samples"]
    return header, [data[e["offset"] : e["offset"] + e["length"]] for e in entries], entries


def _seal(header: bytes, records: list[bytes], index: bytes) -> bytes:
    """A shard file of these parts, with a valid header checksum and footer (index checksum included)."""
    checksum = xxhash.xxh3_64_intdigest(PREFIX.pack(MAGIC, VERSION, 0, len(header), 0)[:16] + header)
    body = PREFIX.pack(MAGIC, VERSION, 0, len(header), checksum) + header + b"".join(records)
    return body + index + FOOTER.pack(len(body), len(index), xxhash.xxh3_64_intdigest(index), b"E3SHEND1")


def _entries_for(header: bytes, records: list[bytes], entries: list[dict]) -> list[dict]:
    """The index entries re-laid over `records` (offsets, lengths and checksums recomputed, the rest kept)."""
    offset, laid = PREFIX.size + len(header), []
    for entry, record in zip(entries, records, strict=True):
        laid.append({**entry, "offset": offset, "length": len(record), "xxh3": xxhash.xxh3_64_intdigest(record)})
        offset += len(record)
    return laid


def _craft(path, header=None, records=None, entry_changes=None, index=None):
    """Rewrite the shard at `path` with its header (a dict, or raw bytes), some records, some index entry fields
    (position -> fields) or the whole index replaced, every checksum valid."""
    old_header, old_records, old_entries = _parts(path)
    header = json.dumps(header, sort_keys=True).encode() if isinstance(header, dict) else header or old_header
    records = [records.get(i, r) for i, r in enumerate(old_records)] if records else old_records
    entries = _entries_for(header, records, old_entries)
    for position, fields in (entry_changes or {}).items():
        entries[position].update(fields)
    if index is None:
        index = json.dumps({"samples": entries}, sort_keys=True).encode()
    path.write_bytes(_seal(header, records, index))
    return path


def _record(tokens, layers, width, sections):
    return RECORD_HEAD.pack(tokens, layers, width, *map(len, sections)) + b"".join(sections)


def _unpack(record):
    tokens, layers, width, *lengths = RECORD_HEAD.unpack_from(record)
    sections, offset = [], RECORD_HEAD.size
    for length in lengths:
        sections.append(record[offset : offset + length])
        offset += length
    return tokens, layers, width, sections


def _zeros_frame(size: int, declare_size: bool = True) -> bytes:
    """A zstd frame of `size` zero bytes (a few KB for a GiB), compressed a MiB at a time."""
    compressor = zstandard.ZstdCompressor(level=1, write_content_size=declare_size)
    stream = compressor.compressobj(size=size if declare_size else -1)
    chunk, frame = bytes(2**20), []
    for start in range(0, size, len(chunk)):
        frame.append(stream.compress(chunk[: min(len(chunk), size - start)]))
    return b"".join(frame) + stream.flush()


@contextmanager
def _peak():
    """Measures the peak bytes allocated inside it: `meter.bytes` once it exits."""
    meter = PeakBytes()
    tracemalloc.start()
    try:
        with meter:
            yield meter
    finally:
        meter.bytes = tracemalloc.get_traced_memory()[1] + meter.peak
        tracemalloc.stop()


@pytest.fixture(autouse=True, scope="module")
def _meter_warmed(tmp_path_factory):
    """The first op run under a dispatch mode imports torch modules (tens of MB of Python objects): not what a
    read allocates, so it happens before any measurement."""
    reader = ShardReader(_write(tmp_path_factory.mktemp("warm") / "shard.e3sh"))
    with PeakBytes():
        reader.read(BIG)
    reader.close()


def _states_bytes(tokens: int) -> int:
    """A sample's decoded size as the header and index declare it: bf16 states, int64 ids, bool mask."""
    return len(META.layer_ids) * tokens * META.hidden_size * 2 + 9 * tokens


# --- the hostile records -------------------------------------------------------------------------------------


def _hostile_records():
    """name -> (change to sample BIG's record, index entry fields to set, the error it must give)."""
    tokens = SAMPLES[BIG][1].shape[0]

    def head(record, **fields):
        said, layers, width, sections = _unpack(record)
        values = {"tokens": said, "layers": layers, "width": width, **fields}
        return RECORD_HEAD.pack(values["tokens"], values["layers"], values["width"], *map(len, sections)) + b"".join(
            sections
        )

    def section(number, data):
        def change(record):
            said, layers, width, sections = _unpack(record)
            sections[number] = data
            return _record(said, layers, width, sections)

        return change

    def negative_id(record):
        ids = np.frombuffer(zstandard.ZstdDecompressor().decompress(_unpack(record)[3][0]), dtype="<i4").copy()
        ids[3] = -5
        return section(0, zstandard.ZstdCompressor().compress(ids.tobytes()))(record)

    return {
        "head claims 2^31 tokens": (
            lambda r: head(r, tokens=2**31),
            {},
            f"the record's head has tokens {2**31}, its index entry {tokens}",
        ),
        "head and index claim 2^30 tokens, the sections do not": (
            lambda r: head(r, tokens=2**30),
            {"tokens": 2**30},
            f"input ids section declares {4 * tokens} bytes decompressed, expected {4 * 2**30}",
        ),
        "head claims other layers": (lambda r: head(r, layers=3), {}, "the record's head has layers 3, the header 4"),
        "head claims another width": (
            lambda r: head(r, width=65),
            {},
            "the record's head has hidden size 65, the header 64",
        ),
        "input ids: a 1 GiB zstd frame (decompression bomb)": (
            section(0, _zeros_frame(GIB)),
            {},
            f"input ids section declares {GIB} bytes decompressed, expected {4 * tokens}",
        ),
        "aux high bytes: a 1 GiB zstd frame (decompression bomb)": (
            section(2, _zeros_frame(GIB)),
            {},
            f"aux high bytes section declares {GIB} bytes decompressed, expected {3 * tokens * 64}",
        ),
        "input ids: a 1 GiB zstd frame declaring no size": (
            section(0, _zeros_frame(GIB, declare_size=False)),
            {},
            f"input ids section declares no size decompressed, expected {4 * tokens}",
        ),
        "input ids: two frames back to back": (
            section(0, zstandard.ZstdCompressor().compress(bytes(4 * tokens)) * 2),
            {},
            "input ids section does not decompress (compressed input contains",
        ),
        "input ids: not zstd": (section(0, b"\x00" * 40), {}, "input ids section is not a zstd frame"),
        "section lengths beyond the record": (
            lambda r: r[:12] + struct.pack("<I", struct.unpack_from("<I", r, 12)[0] + 1) + r[16:],
            {},
            "the record's sections add up to",
        ),
        "negative token id": (negative_id, {}, "negative token id -5"),
    }


HOSTILE_RECORDS = _hostile_records()


@pytest.mark.parametrize("case", list(HOSTILE_RECORDS))
def test_a_crafted_record_is_one_shard_error_before_anything_is_allocated(tmp_path, case):
    change, entry_fields, message = HOSTILE_RECORDS[case]
    path = _write(tmp_path / "shard-00000-000.e3sh")
    _, records, _ = _parts(path)
    _craft(path, records={BIG: change(records[BIG])}, entry_changes={BIG: entry_fields})
    reader = ShardReader(path)
    entry = reader.entries[BIG]
    declared = entry["length"]
    with _peak() as meter:
        with pytest.raises(ShardError) as caught:
            reader.read(BIG)
    assert str(caught.value).startswith(f"{path}: sample {BIG} (s{BIG}): {message}"), str(caught.value)
    assert str(caught.value).endswith("rerun `eagle3 extract`") and "\n" not in str(caught.value)
    # Refused before decoding: at most the record's own bytes, which it reads.
    assert meter.bytes < 2 * declared, (case, meter.bytes, declared)
    # The other samples still read, exactly.
    sample = reader.read(0)
    assert torch.equal(sample.input_ids, SAMPLES[0][1]) and torch.equal(sample.hidden, SAMPLES[0][3])
    reader.close()


def test_token_ids_beyond_the_verifiers_vocab_are_refused(tmp_path):
    path = _write(tmp_path / "shard.e3sh")
    largest = int(SAMPLES[BIG][1].max())
    assert int(SAMPLES[0][1].max()) < largest
    reader = ShardReader(path, vocab_size=largest)
    assert torch.equal(reader.read(0).input_ids, SAMPLES[0][1])  # ids below the vocab size read
    with pytest.raises(ShardError) as caught:
        reader.read(BIG)
    assert str(caught.value) == (
        f"{path}: sample {BIG} (s{BIG}): token id {largest} >= the verifier's vocab size {largest}; rerun "
        "`eagle3 extract` for this verifier"
    )


def test_a_loss_mask_disagreeing_with_the_index_is_refused(tmp_path):
    path = _write(tmp_path / "shard.e3sh")
    loss_tokens = int(SAMPLES[BIG][2].sum())
    _craft(path, entry_changes={BIG: {"loss_tokens": loss_tokens - 1}})
    reader = ShardReader(path)
    with pytest.raises(ShardError) as caught:
        reader.read(BIG)
    assert str(caught.value) == (
        f"{path}: sample {BIG} (s{BIG}): the loss mask holds {loss_tokens} tokens, the index {loss_tokens - 1}; "
        "delete it and rerun `eagle3 extract`"
    )


# --- hostile headers, indexes and footers --------------------------------------------------------------------


def _changed(**changes):
    """A change to a header: these fields set (to _DROP: removed)."""

    def change(header: dict):
        header = {**header, **changes}
        return {key: value for key, value in header.items() if value is not _DROP}

    return change


_DROP = object()
HOSTILE_HEADERS = {
    "layer_ids is 5": (_changed(layer_ids=5), "layer_ids: Input should be a valid list (got 5)"),
    "a layer id is a string": (_changed(layer_ids=[2, "15", 27, 30]), "layer_ids[1]: Input should be a valid integer"),
    "a layer id is true": (_changed(layer_ids=[2, True, 27, 30]), "layer_ids[1]: Input should be a valid integer"),
    "one layer": (_changed(layer_ids=[30]), "layer_ids: List should have at least 2 items"),
    "a repeated layer": (_changed(layer_ids=[2, 2, 27, 30]), "layer_ids [2, 2, 27, 30] repeat a layer"),
    "negative layer": (_changed(layer_ids=[-1, 15, 27, 30]), "layer_ids[0]: Input should be greater than or equal"),
    "hidden_size a string": (_changed(hidden_size="64"), "hidden_size: Input should be a valid integer (got '64')"),
    "hidden_size 2^40": (_changed(hidden_size=2**40), "hidden_size: Input should be less than or equal to 262144"),
    "hidden_size 0": (_changed(hidden_size=0), "hidden_size: Input should be greater than or equal to 1"),
    "unknown storage": (_changed(storage="fp4"), "storage: Input should be 'bf16-lossless'"),
    "dtype float16": (_changed(dtype="float16"), "dtype: Input should be 'bfloat16'"),
    "tokenizer hash not hex": (_changed(tokenizer_sha256="x" * 64), "tokenizer_sha256: String should match pattern"),
    "verifier missing": (_changed(verifier=_DROP), "verifier: Field required"),
    "an unknown field": (_changed(extra=1), "extra: Extra inputs are not permitted"),
    "codec not the storage's": (
        _changed(codec={"aux": "e4m3", "final": "bf16", "level": 1, "hash_log": 10}),
        "codec aux/final e4m3/bf16, but storage bf16-lossless encodes bf16/bf16",
    ),
    "codec level a float": (
        _changed(codec={"aux": "bf16", "final": "bf16", "level": 1.0, "hash_log": 10}),
        "codec.level: Input should be a valid integer",
    ),
    "version disagreeing with the prefix": (
        _changed(version=VERSION + 1),
        f"version {VERSION + 1}, but the file's prefix says {VERSION}",
    ),
    "a list, not an object": (lambda header: json.dumps([1, 2]).encode(), "a JSON list, not an object"),
    "not UTF-8 JSON": (lambda header: b"\xff\xfe not json", "not JSON ("),
    "deeply nested": (lambda header: b"[" * 20000, "not JSON (maximum recursion depth exceeded"),
}


@pytest.mark.parametrize("case", list(HOSTILE_HEADERS))
def test_a_wrong_typed_or_out_of_range_header_is_a_shard_error_naming_the_field(tmp_path, case):
    change, message = HOSTILE_HEADERS[case]
    path = _write(tmp_path / "shard.e3sh")
    path = _craft(path, header=change(json.loads(_parts(path)[0])))
    with pytest.raises(ShardError) as caught:
        ShardReader(path)
    assert str(caught.value).startswith(f"{path}: shard header: {message}"), str(caught.value)
    assert str(caught.value).endswith("delete it and rerun `eagle3 extract`") and "\n" not in str(caught.value)


def test_the_header_has_its_own_checksum(tmp_path):
    path = _write(tmp_path / "shard.e3sh")
    data = bytearray(path.read_bytes())
    # Still a valid header (hidden_size 65), but not the one written.
    data[data.index(b'"hidden_size": 64') + len('"hidden_size": 6')] = ord("5")
    path.write_bytes(bytes(data))
    with pytest.raises(ShardError) as caught:
        ShardReader(path)
    assert str(caught.value) == (
        f"{path}: header checksum mismatch: the shard is damaged; delete it and rerun `eagle3 extract`"
    )


def test_a_header_length_past_any_header_is_refused_before_reading_it(tmp_path):
    path = _write(tmp_path / "shard.e3sh")
    header, records, _ = _parts(path)
    # Valid JSON, and a valid checksum over it: only its length gives it away.
    padded = header[:-1] + b" " * 2**17 + b"}"
    path.write_bytes(_seal(padded, records, json.dumps({"samples": []}).encode()))
    with pytest.raises(ShardError) as caught:
        ShardReader(path)
    assert str(caught.value) == (
        f"{path}: header length {len(padded)} bytes, more than a shard header's 65536: the shard is damaged; "
        "delete it and rerun `eagle3 extract`"
    )


def _entry(position, **fields):
    """A change to the index: one entry's fields set."""

    def change(header, records, entries):
        laid = _entries_for(header, records, entries)
        laid[position].update(fields)
        return json.dumps({"samples": laid}).encode()

    return change


def _whole(index: dict):
    return lambda header, records, entries: json.dumps(index).encode()


# name -> (the index, the error given (first, the first record's offset), end, the index's offset)
INDEX_CASES = {
    "an offset past the end of the file": (
        _entry(1, offset=10**12),
        "sample 1 (s1): offset {big}, expected {second} (records lie back to back between the header and the "
        "index at {end})",
    ),
    "an offset into the header": (_entry(0, offset=3), "sample 0 (s0): offset 3, expected {first}"),
    "a negative offset": (_entry(2, offset=-1), "samples[2].offset: Input should be greater than or equal to 0"),
    "a length running into the index": (
        _entry(3, length=10**6),
        "the records end at byte {long_end}, the index starts at {end}",
    ),
    "a length shorter than a head": (_entry(0, length=4), "sample 0 (s0): length 4 is shorter than a record's head"),
    "tokens as a string": (_entry(1, tokens="300"), "samples[1].tokens: Input should be a valid integer (got '300')"),
    "no tokens": (_entry(1, tokens=0), "samples[1].tokens: Input should be greater than or equal to 1"),
    "more loss tokens than tokens": (_entry(2, loss_tokens=2), "sample 2 (s2): 2 loss tokens of 1 tokens"),
    "a checksum beyond 64 bits": (_entry(0, xxh3=2**64), "samples[0].xxh3: Input should be less than"),
    "a repeated id": (_entry(1, id="s0"), "sample 1 (s0): the id appears twice"),
    "an id with a newline": (_entry(1, id="s1\nTraceback"), "samples[1].id: String should match pattern"),
    "samples not a list": (_whole({"samples": 5}), "samples: Input should be a valid list (got 5)"),
    "an unknown field": (_whole({"samples": [], "more": 1}), "more: Extra inputs are not permitted"),
}


@pytest.mark.parametrize("case", list(INDEX_CASES))
def test_index_entries_pointing_anywhere_but_their_record_are_refused(tmp_path, case):
    change, message = INDEX_CASES[case]
    path = _write(tmp_path / "shard.e3sh")
    header, records, entries = _parts(path)
    first = PREFIX.size + len(header)
    end = first + sum(map(len, records))
    where = {"big": 10**12, "first": first, "second": first + len(records[0]), "end": end}
    where["long_end"] = end - len(records[3]) + 10**6
    path = _craft(path, index=change(header, records, entries))
    with pytest.raises(ShardError) as caught:
        ShardReader(path)
    assert str(caught.value).startswith(f"{path}: shard index: {message.format(**where)}"), str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_footer_pointing_the_index_into_the_header_is_refused(tmp_path):
    path = _write(tmp_path / "shard.e3sh")
    header, records, _ = _parts(path)
    body = _seal(header, records, b"")[: -FOOTER.size]
    # The "index" is the file's own bytes from offset 10 on, with a valid checksum over them.
    index = body[10:]
    path.write_bytes(body + FOOTER.pack(10, len(index), xxhash.xxh3_64_intdigest(index), b"E3SHEND1"))
    with pytest.raises(ShardError) as caught:
        ShardReader(path)
    assert str(caught.value) == (
        f"{path}: footer: the index at byte 10 overlaps the header, which ends at {PREFIX.size + len(header)}; "
        "delete it and rerun `eagle3 extract`"
    )


def test_a_valid_shard_reads_back_unchanged_through_the_checks(tmp_path):
    """The re-sealing helper itself changes nothing: a shard rebuilt from its own parts reads as written."""
    path = _write(tmp_path / "shard.e3sh")
    original = path.read_bytes()
    assert _craft(path).read_bytes() == original
    reader = ShardReader(path)
    for position, (sample_id, ids, mask, hidden) in enumerate(SAMPLES):
        sample = reader.read(position)
        assert sample.sample_id == sample_id and torch.equal(sample.input_ids, ids)
        assert torch.equal(sample.loss_mask, mask) and torch.equal(
            sample.hidden.view(torch.int16), hidden.view(torch.int16)
        )


def test_a_valid_read_allocates_a_small_multiple_of_what_its_shard_declares(tmp_path):
    """The decoded states are built in place (no joined copy), so a read's peak is the record plus its states and
    a plane's worth of scratch."""
    for storage in ("bf16-lossless", "fp8"):
        reader = ShardReader(_write(tmp_path / f"{storage}.e3sh", storage=storage))
        entry = reader.entries[BIG]
        with _peak() as meter:
            sample = reader.read(BIG)
        assert sample.hidden.shape == (4, 300, 64)
        declared = entry["length"] + _states_bytes(entry["tokens"])
        assert meter.bytes < 2 * declared, (storage, meter.bytes, declared)
        reader.close()


# --- the fuzz test -------------------------------------------------------------------------------------------


FUZZ_SAMPLES = [_sample(100 + seed, tokens, vocab=32000) for seed, tokens in enumerate([96, 1, 160, 33])]


def _expect_original(reader, position, written):
    """Unresealed, any read that succeeds returns exactly what the valid file gives (`written`)."""
    try:
        sample = reader.read(position)
        assert sample.sample_id == written[position].sample_id
        assert torch.equal(sample.input_ids, written[position].input_ids)
        assert torch.equal(sample.loss_mask, written[position].loss_mask)
        assert torch.equal(sample.hidden.view(torch.int16), written[position].hidden.view(torch.int16))
    except ShardError:
        pass


def _expect_declared(reader, position, written):
    """A re-sealed mutation can decode to other values: then it must have exactly the declared shapes."""
    entry = reader.entries[position]
    shape = (len(reader.meta.layer_ids), entry["tokens"], reader.meta.hidden_size)
    try:
        sample = reader.read(position)
        assert sample.hidden.shape == shape and sample.hidden.dtype == torch.bfloat16
        assert sample.input_ids.shape == sample.loss_mask.shape == (entry["tokens"],)
        assert int(sample.loss_mask.sum()) == entry["loss_tokens"] and int(sample.input_ids.min()) >= 0
    except ShardError:
        pass


def _flipped(data: bytes, rng: random.Random) -> bytes:
    mutated = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        mutated[rng.randrange(len(mutated))] ^= rng.randint(1, 255)
    if rng.random() < 0.3:
        mutated = mutated[: rng.randrange(len(mutated))]
    return bytes(mutated)


def _resealed(data: bytes, rng: random.Random, path) -> bytes:
    """Byte flips inside the header, one record or the index, with that part's checksums made valid again."""
    path.write_bytes(data)
    header, records, entries = _parts(path)
    target = rng.choice(["header", "record", "record", "index"])

    def flip(blob: bytes) -> bytes:
        mutated = bytearray(blob)
        for _ in range(rng.randint(1, 3)):
            mutated[rng.randrange(len(mutated))] ^= rng.randint(1, 255)
        return bytes(mutated)

    if target == "header":
        return _seal(flip(header), records, json.dumps({"samples": entries}, sort_keys=True).encode())
    if target == "record":
        position = rng.randrange(len(records))
        records = [flip(r) if i == position else r for i, r in enumerate(records)]
        index = json.dumps({"samples": _entries_for(header, records, entries)}, sort_keys=True).encode()
        return _seal(header, records, index)
    return _seal(header, records, flip(json.dumps({"samples": entries}, sort_keys=True).encode()))


def _declared(reader, position) -> int:
    """What the shard declares for one read: the record's bytes and its decoded sample."""
    entry = reader.entries[position]
    states = len(reader.meta.layer_ids) * entry["tokens"] * reader.meta.hidden_size * 2
    return entry["length"] + states + 9 * entry["tokens"]


# A read's fixed costs (its objects, an error's message and traceback), whatever the record's size.
FIXED_COSTS = 2**16
FUZZ_TRIALS = 400


def test_fuzzed_shards_read_back_exactly_or_raise_shard_error_within_bounded_memory(tmp_path):
    """Seeded: random byte flips and truncations of valid shards (both codecs) read back exactly what was written
    or raise ShardError; flips re-sealed with valid checksums raise ShardError or decode to the declared shapes.
    Never another exception, and no read allocates more than twice what its shard declares for it."""
    rng = random.Random(33)
    started, reads, refused = time.monotonic(), 0, 0
    for storage in ("bf16-lossless", "fp8-compact"):
        valid_path = _write(tmp_path / f"valid-{storage}.e3sh", FUZZ_SAMPLES, storage)
        valid, original = valid_path.read_bytes(), ShardReader(valid_path)
        # What the valid file reads as (the 8-bit codecs are lossy): the ids and mask are FUZZ_SAMPLES' own.
        written = [original.read(position) for position in range(len(FUZZ_SAMPLES))]
        assert all(torch.equal(w.input_ids, s[1]) for w, s in zip(written, FUZZ_SAMPLES, strict=True))
        path = tmp_path / "fuzzed.e3sh"
        for trial in range(FUZZ_TRIALS):
            resealed = trial % 2 == 1
            path.write_bytes(_resealed(valid, rng, path) if resealed else _flipped(valid, rng))
            try:
                reader = ShardReader(path)
            except ShardError:
                refused += 1
                continue
            # Unresealed, the index is the valid one (its checksum holds), so positions are FUZZ_SAMPLES'.
            for position in range(len(reader)):
                bound = 2 * _declared(reader, position) + FIXED_COSTS
                # The smaller of two measurements: tracemalloc also counts what another thread of this process (the
                # test runner's) allocates meanwhile, never twice the same; a read's own allocations repeat.
                peaks = []
                while len(peaks) < 2 and (not peaks or peaks[0] >= bound):
                    with _peak() as meter:
                        (_expect_declared if resealed else _expect_original)(reader, position, written)
                    peaks.append(meter.bytes)
                assert min(peaks) < bound, (storage, trial, position, peaks)
                reads += 1
            reader.close()
    # Both outcomes were exercised: files refused on opening, and records read (exactly, or refused).
    assert refused > FUZZ_TRIALS // 4 and reads > FUZZ_TRIALS
    assert time.monotonic() - started < 60


def test_a_shard_error_in_a_dataloader_worker_reaches_training_as_its_one_line(tmp_path):
    """torch re-raises a worker's exception as its type holding the worker's traceback; training's `loader_batches`
    gives back the error's own line (what the CLI prints), whichever process read the record."""
    from eagle3.formats.shards import HiddenStateDataset
    from eagle3.training.data import loader_batches

    path = _write(tmp_path / "shard.e3sh")
    change, _, _ = HOSTILE_RECORDS["head claims 2^31 tokens"]
    _craft(path, records={BIG: change(_parts(path)[1][BIG])})
    dataset = HiddenStateDataset([path])
    with pytest.raises(ShardError) as direct:
        dataset[BIG]
    for workers in (0, 1):
        with pytest.raises(ShardError) as raw:
            list(torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers))
        assert ("Traceback" in str(raw.value)) == (workers == 1)  # the wrapping `loader_batches` undoes
        with pytest.raises(ShardError) as caught:
            list(loader_batches(torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers)))
        assert str(caught.value) == str(direct.value)
