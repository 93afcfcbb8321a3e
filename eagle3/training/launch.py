"""How the train stage starts its processes: in this one, or under torchrun as params.yaml `train.launch` says.

`dvc repro` runs `python stages/train.py`; when `launch` asks for more than one process, that process starts
torchrun (its own module, its own flags) on `eagle3 train` with the same params file, waits, and exits with its
status. The processes it starts see torchrun's WORLD_SIZE and train; they never launch again.
"""

import os
import subprocess
import sys
from pathlib import Path

import torch

from eagle3.errors import Eagle3Error
from eagle3.params.train import LaunchParams

# Every node of one run must name the same rendezvous id; one run per endpoint at a time.
RENDEZVOUS_ID = "eagle3-train"


def processes_per_node(launch: LaunchParams) -> int:
    if launch.processes_per_node != "auto":
        return launch.processes_per_node
    return max(torch.cuda.device_count(), 1)


def launcher_command(launch: LaunchParams, params_file: Path) -> list[str] | None:
    """The torchrun command that runs this stage as `launch` says, or None to train in this process."""
    if "WORLD_SIZE" in os.environ:  # already one of torchrun's processes
        return None
    per_node = processes_per_node(launch)
    if per_node == 1 and launch.nodes == 1:
        return None
    if launch.nodes == 1:
        where = ["--standalone"]
    else:
        where = [
            f"--nnodes={launch.nodes}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={launch.rendezvous}",
            f"--rdzv-id={RENDEZVOUS_ID}",
        ]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={per_node}",
        *where,
        "-m",
        "eagle3.cli",
        "--params",
        str(params_file),
        "train",
    ]


def launch(command: list[str]) -> None:
    status = subprocess.run(command).returncode
    if status:
        raise Eagle3Error(
            f"torchrun exited with status {status}: a training process failed (its error is above); "
            "rerun to resume from the newest checkpoint"
        )
