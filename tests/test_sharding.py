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


def run(
    directory: Path, processes: int, sharding: str = "fsdp", optimizer: str = "adamw", layer: str = "llama"
) -> dict:
    directory.mkdir(exist_ok=True)
    before = {p.name for p in directory.glob("result-*.json")}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(processes)]
    arguments = [str(WORKER), sharding, str(STEPS), str(directory), optimizer, layer]
    command = (launcher if processes > 1 else [sys.executable]) + arguments
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


def resume(
    source: Path, step: int, directory: Path, processes: int, optimizer: str = "adamw", layer: str = "llama"
) -> dict:
    """`processes` continuing from `source`'s checkpoint after `step` (the only one in `directory`)."""
    directory.mkdir()
    shutil.copytree(source / f"step-{step:07d}", directory / f"step-{step:07d}")
    return run(directory, processes, "ddp" if optimizer == "muon" else "fsdp", optimizer, layer)


def test_resume_from_one_process_into_two_and_back(single, tmp_path):
    one_dir, one = single
    two = resume(one_dir, 2, tmp_path / "into-two", 2)
    close(one["losses"][2:], two["losses"])
    back = resume(tmp_path / "into-two", 4, tmp_path / "back", 1)
    close(one["losses"][4:], back["losses"])


def test_muon_trains_the_same_model_in_one_process_and_two_and_resumes_exactly(single, tmp_path):
    one = run(tmp_path / "one", 1, "ddp", "muon")
    assert one["losses"] != single[1]["losses"]  # another optimizer, another model (the first step's loss aside)
    close(one["losses"], run(tmp_path / "two", 2, "ddp", "muon")["losses"])
    resumed = resume(tmp_path / "one", 3, tmp_path / "resumed", 1, "muon")
    assert resumed["losses"] == one["losses"][3:]
    final = f"step-{STEPS:07d}"
    for file in ("model.safetensors", "optimizer.safetensors"):
        kept, again = load_file(tmp_path / "one" / final / file), load_file(tmp_path / "resumed" / final / file)
        assert kept.keys() == again.keys() and all(torch.equal(kept[k], again[k]) for k in kept), file
    state = load_file(tmp_path / "one" / final / "optimizer.safetensors")
    # Muon's momentum for the matrices, AdamW's moments for the head and the norms.
    assert {"fc.weight::momentum_buffer", "lm_head.weight::exp_avg", "norm.weight::exp_avg_sq"} <= set(state)
    assert not any(k.startswith(("fc.weight::exp", "lm_head.weight::momentum")) for k in state)


def test_the_mla_layer_trains_the_same_model_in_one_fsdp_process_and_two_and_resumes(single, tmp_path):
    one = run(tmp_path / "one", 1, layer="mla")
    assert "midlayer.self_attn.kv_a_proj_with_mqa.weight" in one["rows"]
    assert one["losses"] != single[1]["losses"]  # another layer, another model
    two = run(tmp_path / "two", 2, layer="mla")
    close(one["losses"], two["losses"])
    for name, rows in one["rows"].items():
        assert two["rows"][name] == [-(-rows[0] // 2), *rows[1:]], name
    close(one["losses"][3:], resume(tmp_path / "two", 3, tmp_path / "back", 1, layer="mla")["losses"])


def _wait_while_rank_0_writes(rank: int, store: str, how: str, outcome: str) -> None:
    """Two gloo processes whose collectives time out after 2 s; rank 0 "writes" for 5 s, then both meet `how`.
    The wait's group is made at the start, as the train stage makes it: no group may be created while rank 0
    writes (creating one is a collective of the training's group)."""
    import time
    from datetime import timedelta

    import torch.distributed as dist

    from eagle3.training import distributed

    distributed.COLLECTIVE_TIMEOUT = timedelta(seconds=2)
    distributed.SLOWEST_WRITE_BYTES_PER_S = 1e6
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=2, timeout=distributed.COLLECTIVE_TIMEOUT
    )
    world = distributed.Dist(rank, 2)
    # 10 MB at the slowest rate: the wait may take 10 s on top of the collectives' 2.
    world.open_writer_wait(10_000_000)

    def no_group_now(*args, **kwargs):
        raise RuntimeError("a process group created while rank 0 writes")

    dist.new_group = no_group_now
    try:
        if rank == 0:
            time.sleep(5)
        world.wait_for_writer() if how == "writer" else world.barrier()
        result = "met"
    except RuntimeError as exc:
        result = f"failed: {str(exc).splitlines()[0]}"
    Path(f"{outcome}-{rank}").write_text(result)


@pytest.mark.parametrize("how", ["writer", "barrier"])
def test_processes_wait_for_a_checkpoint_written_longer_than_the_collective_timeout(tmp_path, how):
    import torch.multiprocessing as mp

    outcome = tmp_path / "outcome"
    context = mp.spawn(
        _wait_while_rank_0_writes, args=(str(tmp_path / "store"), how, str(outcome)), nprocs=2, join=False
    )
    context.join(timeout=60)
    rank_1 = Path(f"{outcome}-1").read_text()
    if how == "writer":
        assert rank_1 == "met" and Path(f"{outcome}-0").read_text() == "met"
    else:
        # What a plain barrier after the write does: rank 1 gives up while rank 0 is still writing.
        assert rank_1.startswith("failed"), rank_1


def test_the_wait_for_a_writer_grows_with_the_bytes_written():
    from eagle3.training.distributed import COLLECTIVE_TIMEOUT, write_timeout

    # A Kimi-K2.5 draft's checkpoint (~14 GB) on a 20 MB/s volume: beyond torch's 10 minutes on its own.
    assert write_timeout(14 * 10**9).total_seconds() == COLLECTIVE_TIMEOUT.total_seconds() + 700
    assert write_timeout(0) == COLLECTIVE_TIMEOUT
