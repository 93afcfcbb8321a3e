"""A scratch project for the benchmarks that rerun stages on this project's data (storage_8bit.py,
draft_layouts.py): this project's outputs linked in, and the real stages run one at a time in it."""

import os
import subprocess
import sys
import time
from pathlib import Path


def link(root: Path, work: Path, paths) -> None:
    """`work`/path -> `root`/path for each of `paths`: inputs the scratch project reads and never writes."""
    for path in paths:
        (work / path).parent.mkdir(parents=True, exist_ok=True)
        (work / path).symlink_to(root / path)


def run_stage(work: Path, stage: str) -> float:
    """`eagle3 STAGE` in `work` with this interpreter; its wall time in seconds."""
    started = time.monotonic()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run([sys.executable, "-m", "eagle3.cli", stage], cwd=work, env=env)
    if result.returncode:
        raise SystemExit(f"eagle3 {stage} failed in {work} (exit {result.returncode})")
    return time.monotonic() - started
