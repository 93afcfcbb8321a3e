"""A full disk is one line naming the file, the bytes it needed and the bytes free, with nothing half-written under
a final name, and a rerun finishes the work. On a real filesystem that fills up: a small tmpfs, mounted where root
may (skipped with the reason elsewhere)."""

import json
import subprocess
import sys

import pytest
import torch

from eagle3.errors import Eagle3Error
from eagle3.files import write_json
from eagle3.formats.shards import ShardMeta, ShardWriter

from conftest import make_project, tmpfs

META = ShardMeta(verifier="org/model", layer_ids=(2, 5), hidden_size=256, tokenizer_sha256="ab" * 32)


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KB tmpfs: another filesystem that a few writes fill."""
    with tmpfs(tmp_path / "small", "256k") as point:
        yield point


def _message(caught) -> str:
    message = str(caught.value)
    assert "\n" not in message and "bytes free there" in message, message
    return message


def test_a_shard_that_does_not_fit_is_one_line_and_leaves_no_file(small_disk):
    path = small_disk / "shard-00000.e3sh"
    generator = torch.Generator().manual_seed(0)
    with pytest.raises(Eagle3Error) as caught, ShardWriter(path, META, threads=1) as writer:
        for sample in range(40):  # ~80 KB of hard-to-compress states each
            hidden = torch.randn(2, 64, 256, generator=generator).bfloat16()
            writer.add(f"s{sample}", torch.arange(64), torch.ones(64, dtype=torch.bool), hidden)
    assert _message(caught).startswith(f"{path}: no space left on the device (it needs ")
    assert list(small_disk.iterdir()) == []  # neither the shard nor its partial


def test_a_checkpoint_that_does_not_fit_is_one_line_and_leaves_none(small_disk):
    from eagle3.formats.checkpoints import CheckpointState, save_checkpoint
    from eagle3.training.optimizers import DraftOptimizer

    model = torch.nn.Linear(256, 256)  # 263 KB of fp32 weights, more with AdamW's state
    optimizer = DraftOptimizer(torch.optim.AdamW(model.parameters()))
    model(torch.ones(1, 256)).sum().backward()
    optimizer.step()
    with pytest.raises(Eagle3Error) as caught:
        # Unvalidated: the step names the directory, and the disk is full before state.json would be written.
        save_checkpoint(small_disk, model, optimizer, CheckpointState.model_construct(step=1), keep=2)
    state = [value for param in optimizer.state.values() for value in param.values()]
    needed = sum(t.nbytes for t in [*model.state_dict().values(), *state])
    assert _message(caught).startswith(f"{small_disk / 'step-0000001'}: no space left on the device (it needs ")
    assert f"{needed:,} bytes" in str(caught.value)
    assert list(small_disk.iterdir()) == []


def test_a_metrics_file_that_does_not_fit_keeps_the_old_one(small_disk):
    path = small_disk / "eval.json"
    write_json(path, {"headline": 1.5})
    with pytest.raises(Eagle3Error) as caught:
        write_json(path, {"runs": ["x" * 1000] * 400})
    assert _message(caught).startswith(f"{path}: no space left on the device (it needs ")
    assert json.loads(path.read_text()) == {"headline": 1.5}
    assert sorted(p.name for p in small_disk.iterdir()) == ["eval.json"]


def test_a_stage_on_a_full_disk_ends_in_one_line_and_a_rerun_finishes(small_disk, tmp_path):
    """prepare writes its parquet through pyarrow, which names no file: the runner still says where."""
    root = make_project(tmp_path / "project")
    (small_disk / "prepared").mkdir()
    (root / "data/prepared").symlink_to(small_disk / "prepared")
    (small_disk / "filler").write_bytes(b"\0" * (small_disk.stat().st_blksize * 60))  # leave the parquet no room
    run = [sys.executable, "-m", "eagle3.cli", "prepare"]
    failed = subprocess.run(run, cwd=root, capture_output=True, text=True)
    lines = failed.stderr.strip().splitlines()
    assert failed.returncode == 2 and "Traceback" not in failed.stderr, failed.stderr
    assert lines[-1].startswith("eagle3 prepare: error: ") and "no space left on the device" in lines[-1]
    assert sorted(p.name for p in (small_disk / "prepared").iterdir()) == []
    (small_disk / "filler").unlink()
    subprocess.run(run, cwd=root, capture_output=True, text=True, check=True)
    assert (root / "data/prepared/train.parquet").is_file() and (root / "data/prepared").is_symlink()
