import numpy as np
import pytest
import torch

from eagle3.formats.shards import HiddenStateDataset, ShardError, ShardMeta, ShardReader, ShardWriter, check_meta
from eagle3.formats.storage import DEFAULT_STORAGE, STORAGES

META = ShardMeta(verifier="org/model", layer_ids=(2, 15, 27, 30), hidden_size=64, tokenizer_sha256="ab" * 32)


def _sample(seed: int, tokens: int) -> tuple[str, torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    # Activation-like values: mostly small, a few huge channels, as in real residual streams.
    hidden = torch.randn(4, tokens, 64, generator=generator) * torch.logspace(-2, 2.5, 64)
    hidden[:, 0] *= 300
    input_ids = torch.randint(0, 49152, (tokens,), generator=generator)
    loss_mask = torch.rand(tokens, generator=generator) > 0.4
    return f"s{seed}", input_ids, loss_mask, hidden.to(torch.bfloat16)


SAMPLES = [_sample(seed, tokens) for seed, tokens in enumerate([1, 7, 300, 64, 129])]


def _write(path, samples=SAMPLES):
    with ShardWriter(path, META, threads=2) as writer:
        for sample in samples:
            writer.add(*sample)
    return path


def test_roundtrip_is_bit_exact_in_any_order(tmp_path):
    path = _write(tmp_path / "shard-00000.e3sh")
    reader = ShardReader(path)
    assert reader.meta == META and len(reader) == len(SAMPLES)
    for position in (4, 0, 2, 3, 1):
        sample = reader.read(position)
        sample_id, input_ids, loss_mask, hidden = SAMPLES[position]
        assert sample.sample_id == sample_id
        assert torch.equal(sample.input_ids, input_ids) and sample.input_ids.dtype == torch.int64
        assert torch.equal(sample.loss_mask, loss_mask) and sample.loss_mask.dtype == torch.bool
        assert sample.hidden.dtype == torch.bfloat16
        assert torch.equal(sample.hidden.view(torch.int16), hidden.view(torch.int16))
    assert [entry["loss_tokens"] for entry in reader.entries] == [int(s[2].sum()) for s in SAMPLES]
    assert not list(tmp_path.glob("*.partial"))
    reader.close()


def test_stored_smaller_than_raw(tmp_path):
    path = _write(tmp_path / "shard.e3sh")
    raw = sum(s[3].numel() * 2 for s in SAMPLES)
    assert path.stat().st_size < raw / 1.2


def test_flipped_byte_names_shard_and_sample(tmp_path):
    path = _write(tmp_path / "shard.e3sh")
    entry = ShardReader(path).entries[2]
    data = bytearray(path.read_bytes())
    data[entry["offset"] + entry["length"] // 2] ^= 0x01
    path.write_bytes(bytes(data))
    reader = ShardReader(path)
    assert torch.equal(reader.read(1).input_ids, SAMPLES[1][1])  # the other samples stay readable
    with pytest.raises(ShardError) as caught:
        reader.read(2)
    assert str(caught.value) == (
        f"{path}: sample 2 (s2): checksum mismatch: the shard is damaged; delete it and rerun `eagle3 extract`"
    )
    reader.close()
    assert reader.handle.closed


def test_damaged_index_is_reported(tmp_path):
    path = _write(tmp_path / "shard.e3sh")
    data = bytearray(path.read_bytes())
    data[-40] ^= 0xFF  # inside the index JSON
    path.write_bytes(bytes(data))
    with pytest.raises(ShardError, match="index checksum mismatch: the shard is damaged"):
        ShardReader(path)


@pytest.mark.parametrize("keep", [0.5, 0.999, 20])
def test_truncated_shard_is_reported(tmp_path, keep):
    path = _write(tmp_path / "shard.e3sh")
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep) if keep < 1 else keep])
    with pytest.raises(ShardError) as caught:
        ShardReader(path)
    assert str(caught.value) == (
        f"{path}: truncated or unfinished shard (no valid end marker); delete it and rerun `eagle3 extract`"
    )


def test_failed_write_leaves_nothing(tmp_path):
    path = tmp_path / "shard.e3sh"
    with pytest.raises(ValueError):
        with ShardWriter(path, META) as writer:
            writer.add(*SAMPLES[0])
            writer.add(
                "bad",
                torch.zeros(3, dtype=torch.long),
                torch.ones(3, dtype=torch.bool),
                torch.zeros(4, 3, 32, dtype=torch.bfloat16),
            )  # wrong hidden size
    assert list(tmp_path.iterdir()) == []


def test_metadata_disagreeing_with_params_is_one_error(tmp_path):
    path = _write(tmp_path / "shard.e3sh")
    with pytest.raises(ShardError) as caught:
        HiddenStateDataset(
            [path], expected={"layer_ids": [2, 15, 27], "hidden_size": 64, "tokenizer_sha256": "cd" * 32}
        )
    assert str(caught.value) == (
        f"{path}: made for other settings: layer_ids is (2, 15, 27, 30), expected [2, 15, 27]; "
        f"tokenizer_sha256 is {'ab' * 32!r}, expected {'cd' * 32!r}; rerun `eagle3 extract` for these params"
    )
    check_meta(path, ShardReader(path).meta, {"layer_ids": [2, 15, 27, 30], "hidden_size": 64})


def test_dataloader_workers_read_every_sample_once(tmp_path):
    paths = [_write(tmp_path / "a.e3sh", SAMPLES[:2]), _write(tmp_path / "b.e3sh", SAMPLES[2:])]
    dataset = HiddenStateDataset(paths, expected={"hidden_size": 64})
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=None, num_workers=2, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
    seen = {item["id"]: item for item in loader}
    assert sorted(seen) == sorted(s[0] for s in SAMPLES)
    for sample_id, input_ids, _, hidden in SAMPLES:
        assert torch.equal(seen[sample_id]["input_ids"], input_ids)
        assert np.array_equal(seen[sample_id]["hidden"].view(torch.int16).numpy(), hidden.view(torch.int16).numpy())
    with pytest.raises(IndexError):
        dataset[len(SAMPLES)]


def _split(root, samples=SAMPLES):
    """data/hidden of a project with one training shard, as the extract stage leaves it for the vocab stage."""
    from eagle3.formats.shards import write_index

    path = _write(root / "data/hidden/train/shard-00000-000.e3sh", samples)
    write_index(root / "data/hidden", META, {"train": [path]})
    return root


def _write_with(path, storage, samples=SAMPLES):
    from dataclasses import replace

    with ShardWriter(path, replace(META, storage=storage), threads=2) as writer:
        for sample in samples:
            writer.add(*sample)
    return path


# Per 8-bit encoding: half a step relative to the value, half the subnormal step relative to the scale.
HALF_STEP = {"e4m3": (2**-4, 2**-10), "e5m2": (2**-3, 2**-17)}


@pytest.mark.parametrize("storage", [name for name in STORAGES if name != DEFAULT_STORAGE])
def test_8bit_storage_round_trip_is_within_its_bound_and_keeps_lossless_roles_exact(tmp_path, storage):
    from eagle3.formats.shards import FP8

    reader = ShardReader(_write_with(tmp_path / "shard.e3sh", storage))
    assert reader.meta.storage == storage
    for position, (sample_id, input_ids, loss_mask, hidden) in enumerate(SAMPLES):
        sample = reader.read(position)
        assert sample.sample_id == sample_id and sample.hidden.dtype == torch.bfloat16
        assert torch.equal(sample.input_ids, input_ids) and torch.equal(sample.loss_mask, loss_mask)
        roles = (STORAGES[storage].aux, STORAGES[storage].final)
        for layers, encoding in zip((slice(0, 3), slice(3, 4)), roles, strict=True):
            original, stored = hidden[layers].float(), sample.hidden[layers].float()
            if encoding == "bf16":
                assert torch.equal(stored, original)
                continue
            relative, subnormal = HALF_STEP[encoding]
            scale = original.abs().amax(-1, keepdim=True) / FP8[encoding][1]
            # The format's rounding, then bf16's (half a step: 2^-9 relative).
            bound = (original.abs() * relative + scale * subnormal) * (1 + 2**-8) + original.abs() * 2**-9
            error = (stored - original).abs()
            assert bool((error <= bound).all()), float((error - bound).max())
            assert float(error.max()) > 0  # lossy: an exact result would mean the 8-bit encoding was not applied
            # Over a whole tensor the error is the format's typical rounding, far from the bound's worst case.
            assert float(error.norm() / original.norm()) < relative


def test_fp8_storage_is_smaller_than_lossless(tmp_path):
    sizes = {s: _write_with(tmp_path / f"{s}.e3sh", s).stat().st_size for s in STORAGES}
    raw = sum(s[3].numel() * 2 for s in SAMPLES)
    # Random mantissas: little zstd gain on the codes here, so about 2x less the scales (real states: benchmarks).
    assert raw / sizes["fp8"] > 1.8
    assert sizes["fp8-compact"] < sizes["fp8"] < sizes["fp8-aux"] < sizes["bf16-lossless"]


def _rewrite_record(path, position, change):
    """Apply `change` to one record's bytes and fix its checksum and the index's, as a buggy writer would."""
    import json
    import struct

    import xxhash

    reader = ShardReader(path)
    entry = reader.entries[position]
    reader.close()
    data = bytearray(path.read_bytes())
    record = bytearray(data[entry["offset"] : entry["offset"] + entry["length"]])
    change(record)
    data[entry["offset"] : entry["offset"] + entry["length"]] = record
    index_offset, index_length = struct.unpack_from("<QQ", data, len(data) - 32)
    index = json.loads(bytes(data[index_offset : index_offset + index_length]))
    index["samples"][position]["xxh3"] = xxhash.xxh3_64_intdigest(bytes(record))
    encoded = json.dumps(index, sort_keys=True).encode()
    footer = struct.pack("<QQQ8s", index_offset, len(encoded), xxhash.xxh3_64_intdigest(encoded), b"E3SHEND1")
    path.write_bytes(bytes(data[:index_offset]) + encoded + footer)


@pytest.mark.parametrize("bad", [float("nan"), -1.0, 0.0, float("inf")])
def test_a_corrupted_scale_is_refused_naming_the_file_and_sample(tmp_path, bad):
    import struct

    path = _write_with(tmp_path / "shard-00003.e3sh", "fp8")

    def corrupt_first_scale(record):
        _tokens, _layers, _width, ids, mask = struct.unpack_from("<5I", record)
        struct.pack_into("<f", record, 36 + ids + mask, bad)  # the first aux scale: after the ids and the mask

    _rewrite_record(path, 2, corrupt_first_scale)
    reader = ShardReader(path)
    reader.read(1)  # the other samples still read
    with pytest.raises(ShardError, match=r"shard-00003.e3sh: sample 2 \(s2\): invalid 8-bit scales") as error:
        reader.read(2)
    assert "\n" not in str(error.value)


def test_a_shard_of_another_format_version_is_refused_naming_the_file(tmp_path):
    from eagle3.formats.shards import VERSION

    path = _write(tmp_path / "shard-00001.e3sh")
    data = bytearray(path.read_bytes())
    data[8:10] = (VERSION - 1).to_bytes(2, "little")  # the format before the header had its checksum
    path.write_bytes(bytes(data))
    with pytest.raises(ShardError) as caught:
        ShardReader(path)
    assert str(caught.value) == (
        f"{path}: shard format version {VERSION - 1}, this eagle3 reads {VERSION}; rerun `eagle3 extract`"
    )
