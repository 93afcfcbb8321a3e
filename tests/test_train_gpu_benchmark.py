"""benchmarks/train_gpu.py runs (here at a tiny shape on CPU; on a GPU machine at Kimi-K2.5's) and reports every
arm; benchmarks/train_memory.py prints its table."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

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
        (tokens, arm) for tokens in ("64", "320") for arm in ("off", "mlp", "full", "reference")
    ]
    for tokens, steps, _, seconds, per_second in rows:
        # seconds is printed to 3 decimals, tokens/s from the unrounded time: it lies within the rounding.
        low, high = int(tokens) / (float(seconds) + 0.0005), int(tokens) / max(float(seconds) - 0.0005, 1e-9)
        assert steps == "2" and low - 1 <= int(per_second) <= high + 1
    for arm in ("mlp", "full", "reference"):
        assert len(re.findall(rf"{arm}/off: time x[\d.]+", result.stdout)) == 2, arm


def test_memory_table_prints_the_estimate_per_setting_and_per_process_split():
    from eagle3.plan.facts import KIMI_K2_5_TEXT_CONFIG
    from eagle3.training.memory import Estimator, GiB, draft_config_for

    script = BENCHMARK.with_name("train_memory.py")
    result = subprocess.run(
        [sys.executable, str(script), "--rows", "2048x2", "--processes", "8"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "64 heads x 128, MLP 18432, draft vocab 32000" in result.stdout
    (row,) = re.findall(r"^\s+2,048 x 2\s+(.*)$", result.stdout, re.MULTILINE)
    cells = re.findall(r"([\d.]+) / n/a", row)  # no GPU here: estimates only
    estimator = Estimator(draft_config_for(KIMI_K2_5_TEXT_CONFIG, 32000), 2)
    expected = [f"{estimator.memory(2048, setting).total / GiB:.1f}" for setting in ("off", "mlp", "full")]
    assert cells == expected
    split = {
        (sharding, setting): [float(v) for v in values.split()]
        for sharding, setting, values in re.findall(
            r"^\s+(ddp|fsdp)\s+(off|mlp|full)\s+([\d. ]+)$", result.stdout, re.M
        )
    }
    assert len(split) == 6
    ddp, fsdp = split["ddp", "off"], split["fsdp", "off"]
    # weights and AdamW state split eight ways, DDP's gradient copy gone, the whole weights gathered for the step
    assert fsdp[0] == pytest.approx(ddp[0] / 8, abs=0.01) and fsdp[1] == pytest.approx(ddp[1] / 8, abs=0.01)
    assert (ddp[2], fsdp[2]) == (ddp[0], 0.0) and (ddp[3], fsdp[3]) == (0.0, ddp[0])
