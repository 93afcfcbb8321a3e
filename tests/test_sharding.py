"""train.sharding fsdp over two gloo processes: each holds half of every parameter, trains the same model as one
process and as DDP (fused AdamW on the sharded parameters), and writes checkpoints that one or two processes
resume from."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

WORKER = Path(__file__).with_name("sharded_training.py")
STEPS = 6


def run(directory: Path, processes: int, sharding: str = "fsdp") -> dict:
    directory.mkdir(exist_ok=True)
    before = {p.name for p in directory.glob("result-*.json")}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(processes)]
    command = (launcher if processes > 1 else [sys.executable]) + [str(WORKER), sharding, str(STEPS), str(directory)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=WORKER.parent)
    assert result.returncode == 0, result.stderr[-3000:]
    (new,) = {p.name for p in directory.glob("result-*.json")} - before
    return json.loads((directory / new).read_text())


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> tuple[Path, dict]:
    directory = tmp_path_factory.mktemp("single")
    return directory, run(directory, 1)


def close(one: list[float], other: list[float]) -> None:
    # tests/test_train.py's 1-vs-2 tolerance
    assert len(one) == len(other) and all(abs(a - b) <= 1e-4 * abs(a) for a, b in zip(one, other, strict=True))


def test_two_fsdp_processes_hold_half_of_each_parameter_and_train_the_same_model(single, tmp_path):
    one_dir, one = single
    two = run(tmp_path, 2)
    close(one["losses"], two["losses"])
    # Bit for bit what two DDP processes train (gradient clipping sums the norm in fp64; in fp32 the slices'
    # order shows in the last bit and grows from step to step), and checkpoints of whole tensors, the same ones.
    ddp_dir = tmp_path / "ddp"
    assert run(ddp_dir, 2, "ddp")["losses"] == two["losses"]
    for file in ("model.safetensors", "optimizer.safetensors"):
        whole, sharded = load_file(ddp_dir / "step-0000003" / file), load_file(tmp_path / "step-0000003" / file)
        assert sharded.keys() == whole.keys() == load_file(one_dir / "step-0000003" / file).keys()
        for key, tensor in whole.items():
            assert torch.equal(sharded[key], tensor), key
    assert two["fused"] is True and two["processes"] == 2
    for name, rows in one["rows"].items():
        # FSDP2 splits the first dimension, rank 0 taking the larger half.
        assert two["rows"][name] == [-(-rows[0] // 2), *rows[1:]], name


def resume(source: Path, step: int, directory: Path, processes: int) -> dict:
    """`processes` continuing from `source`'s checkpoint after `step` (the only one in `directory`)."""
    directory.mkdir()
    shutil.copytree(source / f"step-{step:07d}", directory / f"step-{step:07d}")
    return run(directory, processes)


def test_resume_from_one_process_into_two_and_back(single, tmp_path):
    one_dir, one = single
    two = resume(one_dir, 2, tmp_path / "into-two", 2)
    close(one["losses"][2:], two["losses"])
    back = resume(tmp_path / "into-two", 4, tmp_path / "back", 1)
    close(one["losses"][4:], back["losses"])
