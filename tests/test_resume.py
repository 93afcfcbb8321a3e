"""Ranks sharing a resumable directory: a late rank's cleanup removes leftover partials, never one a live writer
holds (eagle3/files.py, eagle3/resume.py)."""

import fcntl
import os

import torch

import eagle3.files as files
from eagle3.files import partial_path, write_bytes
from eagle3.formats.shards import ShardMeta, ShardReader, ShardWriter
from eagle3.resume import resume_or_reset

META = ShardMeta(verifier="org/model", layer_ids=(2, 5), hidden_size=8, tokenizer_sha256="ab" * 32)


def test_a_late_ranks_cleanup_keeps_the_shard_another_rank_is_writing(tmp_path):
    out = tmp_path / "hidden"
    settings = {"format": 1}
    assert resume_or_reset(out, settings).kept is False  # the first rank decides the directory
    (out / "train").mkdir()
    stale_file = partial_path(out / "train" / "shard-00009.e3sh")
    stale_file.write_bytes(b"left by a killed run")
    stale_dir = partial_path(out / "train" / "step-0000001")
    stale_dir.mkdir()
    (stale_dir / "model.safetensors").write_bytes(b"torn")

    writer = ShardWriter(out / "train" / "shard-00000.e3sh", META, threads=1)
    ids = torch.arange(5)
    writer.add("s0", ids, ids > 1, torch.ones(2, 5, 8, dtype=torch.bfloat16))
    assert resume_or_reset(out, settings).kept is True  # a rank starting later, same settings
    assert not stale_file.exists() and not stale_dir.exists()
    assert partial_path(writer.path).is_file()

    writer.add("s1", ids, ids > 3, torch.full((2, 5, 8), 2.0, dtype=torch.bfloat16))
    reader = ShardReader(writer.close())
    assert [reader.read(i).sample_id for i in range(len(reader))] == ["s0", "s1"]
    assert torch.equal(reader.read(1).hidden, torch.full((2, 5, 8), 2.0, dtype=torch.bfloat16))


def test_a_write_whose_partial_a_cleanup_deleted_before_the_lock_opens_it_again(tmp_path, monkeypatch):
    path = tmp_path / "part-00000.done.json"
    real_flock, calls = fcntl.flock, []

    def cleanup_between_open_and_lock(handle, operation):
        calls.append(operation)
        if len(calls) == 1:
            os.unlink(partial_path(path))  # what remove_unheld does while it holds the lock
        return real_flock(handle, operation)

    monkeypatch.setattr(files.fcntl, "flock", cleanup_between_open_and_lock)
    write_bytes(path, b"finished")
    assert path.read_bytes() == b"finished"
    assert len(calls) == 2 and not partial_path(path).exists()


def test_an_unheld_partial_is_removed_and_a_held_one_kept(tmp_path):
    held, left = tmp_path / ".a.partial", tmp_path / ".b.partial"
    handle = files.open_held(held)
    left.write_bytes(b"x")
    assert files.remove_unheld(held) is False and held.exists()
    assert files.remove_unheld(left) is True and not left.exists()
    handle.close()
    assert files.remove_unheld(held) is True and not held.exists()
