"""`make gpu-check` on a machine without CUDA, as CI runs it: offline, to its summary; every GPU step says it needs
CUDA and the rest pass."""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

pytestmark = pytest.mark.slow


def test_gpu_check_runs_offline_to_its_summary_without_a_gpu(tmp_path):
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(
        [sys.executable, "-m", "eagle3.preflight.gpu_check", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        env=environment,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    names = ["kernels", "training at scale", "extraction", "proposals", "evaluate engine", "preflight"]
    assert [line.split(": ")[1] for line in lines[:-1]] == names
    for line in lines[:5]:
        assert ": needs CUDA (0 s): " in line, line
    assert ": preflight: passed (" in lines[5]
    assert lines[-1] == "gpu-check on no CUDA device: 6 of 6 steps without failure"
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["failed"] == [] and [s["result"] for s in summary["steps"]][-1] == "passed"
    # Preflight ran on the project the step made: the embedded verifier converted there, every item ready.
    items = json.loads((tmp_path / "project/reports/preflight.json").read_text())["items"]
    assert {"machine", "verifier", "training"} <= set(items)
    assert all(item["status"] in ("ready", "not available") for item in items.values()), items
    assert (tmp_path / "project/models/verifier/provenance.json").is_file()
