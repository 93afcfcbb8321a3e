"""The verifier identified by its weights' bytes (eagle3/formats/weight_hashes.py, eagle3/formats/provenance.py):
every weight file hashed, a per-machine cache keyed by the file's stat stamp, Hugging Face cache blobs checked
against their names, and a copy with the same shapes but other bytes refused naming the file."""

import hashlib
import os

import pytest
import torch
from safetensors.torch import save_file

from eagle3.errors import Eagle3Error
from eagle3.formats import weight_hashes
from eagle3.formats.provenance import weights_fingerprint
from eagle3.formats.weight_hashes import file_hashes


@pytest.fixture
def cache(tmp_path):
    return tmp_path / "cache" / "weight-hashes.json"


def _weights(path, seed: int):
    save_file({"w": torch.randn(64, 64, generator=torch.Generator().manual_seed(seed))}, str(path))
    return path


def _counting(monkeypatch) -> list:
    hashed = []
    digest = weight_hashes._digest

    def counted(path, advance):
        hashed.append(path.name)
        return digest(path, advance)

    monkeypatch.setattr(weight_hashes, "_digest", counted)
    return hashed


def test_each_file_is_hashed_once_per_machine_until_it_changes(tmp_path, cache, monkeypatch):
    hashed = _counting(monkeypatch)
    files = [_weights(tmp_path / f"model-{n}.safetensors", n) for n in range(3)]
    first = file_hashes(files, cache)
    assert first == {f: hashlib.sha256(f.read_bytes()).hexdigest() for f in files}
    assert sorted(hashed) == [f.name for f in files]
    assert file_hashes(files, cache) == first and len(hashed) == 3  # stamps unchanged: from the cache
    _weights(files[1], 7)  # rewritten: another inode or time stamp
    again = file_hashes(files, cache)
    assert hashed[3:] == ["model-1.safetensors"]
    assert again[files[1]] == hashlib.sha256(files[1].read_bytes()).hexdigest() != first[files[1]]


def _hub_snapshot(tmp_path, data: bytes, blob_name: str):
    """models--org--name/snapshots/<commit>/model.safetensors -> ../../blobs/<blob_name>, as huggingface_hub lays
    out its cache."""
    repo = tmp_path / "models--org--verifier"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / blob_name).write_bytes(data)
    snapshot = repo / "snapshots" / ("c" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "model.safetensors").symlink_to(f"../../blobs/{blob_name}")
    return snapshot / "model.safetensors"


def test_a_hub_cache_blob_is_checked_against_its_name(tmp_path, cache):
    data = _weights(tmp_path / "source.safetensors", 0).read_bytes()
    right = hashlib.sha256(data).hexdigest()
    entry = _hub_snapshot(tmp_path / "good", data, right)
    assert file_hashes([entry], cache) == {entry: right}
    damaged = bytearray(data)
    damaged[-1] ^= 1
    entry = _hub_snapshot(tmp_path / "bad", bytes(damaged), right)
    with pytest.raises(Eagle3Error) as refused:
        file_hashes([entry], cache)
    assert str(refused.value) == (
        f"{entry}: its Hugging Face cache blob ../../blobs/{right} holds other bytes than its name (sha256 "
        f"{hashlib.sha256(damaged).hexdigest()}): a damaged download; delete the blob and download the model again"
    )


def test_the_fingerprint_changes_with_one_byte_of_one_file(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    directory = tmp_path / "verifier"
    directory.mkdir()
    path = _weights(directory / "model.safetensors", 0)
    before = weights_fingerprint(directory)
    data = bytearray(path.read_bytes())
    data[-5] ^= 1  # a weight's bits: the header (names, shapes) is the same
    os.unlink(path)
    path.write_bytes(data)
    after = weights_fingerprint(directory)
    assert after["weight_bytes"] == before["weight_bytes"]
    assert after["weight_files"]["model.safetensors"]["sha256"] == hashlib.sha256(data).hexdigest()
    assert after["weights_sha256"] != before["weights_sha256"]
