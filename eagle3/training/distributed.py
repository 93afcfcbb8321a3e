"""One process or many (torchrun): which rank this is, its device, the collectives training needs, and how the
draft is spread over the processes (train.sharding).

Under torchrun each process trains on its own device (NCCL between CUDA devices, gloo between CPU
processes); alone, a process takes the first CUDA device if there is one. Reductions run on tensors on the
process's device, which is what NCCL requires.

ddp: every process holds the whole draft, its gradients and AdamW state, and DDP all-reduces the gradients.
fsdp: PyTorch's FSDP2 (`fully_shard`) on the objective as one unit: each process holds a 1/N slice of every
parameter (DTensors) and of its AdamW state, the parameters are gathered whole for the step (the objective's
forward and backward) and the gradients reduce-scattered back into slices. Both average the gradients, which
the objective's loss scaling expects; checkpoints gather the slices (eagle3/formats/checkpoints.py).
"""

import os
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

# How long a process waits in a collective before the run is aborted: torch's default, kept for every collective
# of a step, where waiting longer only hides a dead peer.
COLLECTIVE_TIMEOUT = timedelta(minutes=10)
# The slowest storage a checkpoint is expected to go to (a throttled network volume): while rank 0 writes, the
# others wait that long for each byte on top of COLLECTIVE_TIMEOUT (a Kimi-K2.5 draft's checkpoint is ~14 GB).
SLOWEST_WRITE_BYTES_PER_S = 20e6


def write_timeout(nbytes: int) -> timedelta:
    """How long the other processes wait for rank 0 to write `nbytes`."""
    return COLLECTIVE_TIMEOUT + timedelta(seconds=nbytes / SLOWEST_WRITE_BYTES_PER_S)


@dataclass
class Dist:
    rank: int = 0
    # Processes in the run (torchrun's WORLD_SIZE).
    size: int = 1
    device: torch.device = torch.device("cpu")
    # Processes on this machine (torchrun's LOCAL_WORLD_SIZE): they share its cores and GPUs.
    local_size: int = 1
    # The group the processes wait in while rank 0 writes (open_writer_wait).
    _writer_wait: Any = None

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier()

    def open_writer_wait(self, nbytes: int) -> None:
        """Every process calls it once at the start, before any checkpoint, with the bytes of the largest write
        (a whole checkpoint's): the CPU group wait_for_writer meets in, its timeout sized for that write. Creating
        a group is a collective of the training's group, so it happens here, while every process is at the same
        point, never while rank 0 is writing."""
        if self.size > 1:
            self._writer_wait = dist.new_group(backend="gloo", timeout=write_timeout(nbytes))

    def wait_for_writer(self) -> None:
        """Every process calls it after rank 0 started writing a checkpoint: they meet once it is done. Not in a
        collective of the training's group, whose timeout (and NCCL's watchdog) would abort a run on slow storage,
        but in the group open_writer_wait made."""
        if self.size == 1:
            return
        if self._writer_wait is None:
            raise RuntimeError("wait_for_writer before open_writer_wait")
        dist.barrier(group=self._writer_wait)

    def all_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.size > 1:
            dist.all_reduce(tensor)
        return tensor

    def close(self) -> None:
        if self.size > 1:
            dist.destroy_process_group()


def setup_distributed() -> Dist:
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        return Dist(device=torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local), timeout=COLLECTIVE_TIMEOUT)
        return Dist(rank, size, torch.device("cuda", local), local_size)
    dist.init_process_group("gloo", timeout=COLLECTIVE_TIMEOUT)
    return Dist(rank, size, torch.device("cpu"), local_size)


def distribute(objective: nn.Module, world: Dist, sharding: str) -> nn.Module:
    """What train_step runs: `objective` alone on one process; on several, wrapped in DDP, or under fsdp the
    objective itself with its parameters sharded in place (make the optimizer after this)."""
    if world.size == 1:
        return objective
    if sharding == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        fully_shard(objective, mesh=init_device_mesh(world.device.type, (world.size,)))
        return objective
    # Buffers (the verifier's head rows, aux_scale) are identical on every rank by construction: no broadcast.
    return nn.parallel.DistributedDataParallel(
        objective, broadcast_buffers=False, device_ids=[world.device.index] if world.device.type == "cuda" else None
    )


def gradient_sync(model: nn.Module, last: bool) -> AbstractContextManager:
    """Around a micro-batch's forward and backward: DDP all-reduces the gradients only with the step's last one
    (the earlier ones accumulate locally); FSDP reduce-scatters every one into the sharded gradients, so no
    process ever holds a whole gradient; one process has nothing to synchronise."""
    if isinstance(model, nn.parallel.DistributedDataParallel) and not last:
        return model.no_sync()
    return nullcontext()
