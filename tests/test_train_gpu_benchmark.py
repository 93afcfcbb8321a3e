"""benchmarks/train_gpu.py runs (here at a tiny shape on CPU; on a GPU machine at Kimi-K2.5's) and reports both arms."""

import re
import subprocess
import sys
from pathlib import Path

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "train_gpu.py"


def test_tiny_shape_reports_step_time_and_the_ratio_to_the_reference():
    result = subprocess.run(
        [sys.executable, str(BENCHMARK), "--shape", "tiny", "--tokens", "64", "320", "--ttt-steps", "2"]
        + ["--steps", "1"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "8 heads x 32 (2 KV)" in result.stdout and "draft vocab 256" in result.stdout
    rows = re.findall(r"^\s+(\d+)\s+(\d+)\s+(\w+)\s+([\d.]+)\s+(\d+)", result.stdout, re.MULTILINE)
    assert [(tokens, arm) for tokens, _, arm, _, _ in rows] == [
        (tokens, arm) for tokens in ("64", "320") for arm in ("linear", "recompute", "reference")
    ]
    for tokens, steps, _, seconds, per_second in rows:
        # seconds is printed to 3 decimals, tokens/s from the unrounded time: it lies within the rounding.
        low, high = int(tokens) / (float(seconds) + 0.0005), int(tokens) / max(float(seconds) - 0.0005, 1e-9)
        assert steps == "2" and low - 1 <= int(per_second) <= high + 1
    assert len(re.findall(r"reference/linear: time x[\d.]+", result.stdout)) == 2
    assert len(re.findall(r"recompute/linear: time x[\d.]+", result.stdout)) == 2
