"""One process or many (torchrun): which rank this is, its device, and the collectives training needs.

Under torchrun each process trains on its own device (NCCL between CUDA devices, gloo between CPU
processes); alone, a process takes the first CUDA device if there is one. Reductions run on tensors on the
process's device, which is what NCCL requires.
"""

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Dist:
    rank: int = 0
    # Processes in the run (torchrun's WORLD_SIZE).
    size: int = 1
    device: torch.device = torch.device("cpu")
    # Processes on this machine (torchrun's LOCAL_WORLD_SIZE): they share its cores and GPUs.
    local_size: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier()

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
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        return Dist(rank, size, torch.device("cuda", local), local_size)
    dist.init_process_group("gloo")
    return Dist(rank, size, torch.device("cpu"), local_size)
