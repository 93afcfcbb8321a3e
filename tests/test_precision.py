"""The compute precision `auto`: resolved from the hardware's bf16 capability, recorded, and part of each run key."""

import json
import os
import subprocess
import sys

import pytest
import torch

from eagle3 import precision
from eagle3.environment import capture, differences
from eagle3.precision import cpu_numerics, native_bf16, resolve


@pytest.fixture
def capability(monkeypatch):
    """Force what the CPU's oneDNN and the GPU report about bf16."""

    def force(*, cpu: bool, cuda: bool = False, vendor: str = "GenuineIntel", amx: bool = True) -> None:
        monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: cpu)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: cuda)
        monkeypatch.setattr(precision, "_cpu_vendor", lambda: vendor)
        monkeypatch.setattr(precision, "_cpu_flags", lambda: {"avx512_bf16", *(["amx_bf16"] if amx else [])})

    return force


def test_auto_is_bf16_only_where_the_device_computes_it_natively(capability):
    capability(cpu=True)
    assert native_bf16("cpu") and resolve("auto", "cpu") == "bfloat16"
    capability(cpu=False)
    assert not native_bf16("cpu") and resolve("auto", "cpu") == "float32"
    # A GPU is judged by its own capability, whatever the host CPU can do.
    capability(cpu=False, cuda=True)
    assert resolve("auto", "cuda") == "bfloat16"
    capability(cpu=True, cuda=False)  # e.g. a V100: bf16 only emulated
    assert resolve("auto", "cuda") == "float32" and resolve("auto", "cpu") == "bfloat16"


def test_intel_avx512_bf16_without_amx_is_not_native_amd_avx512_bf16_is(capability):
    """oneDNN supports bf16 on both, but an Intel CPU without AMX computed its bf16 matmuls at about half float32's
    rate (a virtual Xeon hiding its AMX: 87.9 vs 144.2 GFLOP/s in preflight), an AMD EPYC with AVX-512 BF16 at
    twice it (benchmarks/README.md, bf16 vs float32 by CPU kind)."""
    capability(cpu=True, vendor="GenuineIntel", amx=False)
    assert not native_bf16("cpu") and resolve("auto", "cpu") == "float32"
    capability(cpu=True, vendor="AuthenticAMD", amx=False)
    assert native_bf16("cpu") and resolve("auto", "cpu") == "bfloat16"
    capability(cpu=False, vendor="AuthenticAMD", amx=False)  # AVX2 only: emulated
    assert resolve("auto", "cpu") == "float32"


def test_explicit_values_are_kept_whatever_the_hardware(capability):
    capability(cpu=False)
    assert [resolve(value, "cpu") for value in ("bfloat16", "float16", "float32")] == [
        "bfloat16",
        "float16",
        "float32",
    ]


def test_gpu_bf16_check_excludes_emulation(monkeypatch):
    asked = []
    monkeypatch.setattr(
        torch.cuda, "is_bf16_supported", lambda including_emulation=True: asked.append(including_emulation)
    )
    native_bf16("cuda")
    assert asked == [False]


def test_an_isa_cap_makes_bf16_non_native_and_the_record_says_so():
    """oneDNN capped to AVX2 (as on an AVX2-only CPU) reports bf16 as not native; the record shows the cap, while
    the flags stay what the hardware has. Run in a fresh process: torch reads the caps at start-up."""
    script = (
        "import json; from eagle3.environment import capture; from eagle3.precision import resolve; "
        "print(json.dumps({'auto': resolve('auto', 'cpu'), 'record': capture(compute_dtype=resolve('auto', 'cpu'))}))"
    )
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    capped = json.loads(result.stdout)
    assert capped["auto"] == "float32"
    record = capped["record"]
    assert record["cpu"]["capability"] == "AVX2" and record["cpu"]["bf16_native"] is False
    assert record["compute_dtype"] == "float32"
    assert record["switches"]["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    here = capture()
    assert record["cpu"]["flags"] == here["cpu"]["flags"]
    changed = differences(here, record)
    if here["cpu"]["bf16_native"]:
        assert "cpu.bf16_native: True -> False" in changed
    if here["cpu"]["capability"] != "AVX2":
        assert f"cpu.capability: {here['cpu']['capability']} -> AVX2" in changed


def test_cpu_numerics_reads_this_machine():
    numerics = cpu_numerics()
    assert numerics["capability"] == torch.backends.cpu.get_cpu_capability()
    with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
        lines = cpuinfo.readlines()
    flags = next(line for line in lines if line.startswith("flags")).split(":", 1)[1].split()
    vendor = next(line for line in lines if line.startswith("vendor_id")).split(":", 1)[1].strip()
    fast_units = "amx_bf16" in flags or vendor != "GenuineIntel"
    assert numerics["bf16_native"] == (bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()) and fast_units)
    assert numerics["flags"] == [flag for flag in precision.CPU_FLAGS if flag in flags]
    assert capture(compute_dtype="float32")["compute_dtype"] == "float32" and "compute_dtype" not in capture()


def test_a_changed_resolution_changes_generate_and_extract_run_keys(capability, verifier_project, tmp_path):
    """Parts or shards made in bf16 are never mixed with float32 ones: the resolved dtype is in the run key, so
    the same params (`auto`) on a machine that resolves otherwise start over."""
    from eagle3.formats.provenance import read_provenance
    from eagle3.params.params_file import load_params
    from eagle3.resume import resume_or_reset, run_key
    from eagle3.stages import extract, generate

    from conftest import write_params
    from test_generate import _params, project

    root = project(tmp_path, verifier_project, _params())
    params = load_params(write_params(root, _params()))
    provenance = read_provenance(root)
    manifest = root / "manifest.json"
    manifest.write_text("{}")
    meta = extract.shard_meta(params.extract, provenance)

    def keys() -> tuple[str, str]:
        return (
            run_key(generate.run_settings(params.generate, provenance, root)),
            run_key(extract.run_settings(params.extract, provenance, meta, manifest)),
        )

    capability(cpu=True)
    native = keys()
    assert generate.compute_dtype(params.generate) == extract.compute_dtype(params.extract) == "bfloat16"
    out = root / "data/synthetic"
    resume_or_reset(out, generate.run_settings(params.generate, provenance, root))
    (out / "train").mkdir()
    (out / "train/part-00000.jsonl.zst").write_bytes(b"made in bf16")

    capability(cpu=False)
    emulated = keys()
    assert generate.compute_dtype(params.generate) == extract.compute_dtype(params.extract) == "float32"
    assert native[0] != emulated[0] and native[1] != emulated[1]
    assert resume_or_reset(out, generate.run_settings(params.generate, provenance, root)) == (emulated[0], False)
    assert not (out / "train").exists()

    # An explicit dtype means the same everywhere.
    pinned = load_params(write_params(root, _params({"dtype": "float32"})))
    capability(cpu=True)
    here = run_key(generate.run_settings(pinned.generate, provenance, root))
    capability(cpu=False)
    assert run_key(generate.run_settings(pinned.generate, provenance, root)) == here


def test_servers_compute_in_their_own_dtype(capability):
    from eagle3.params.generate import GenerateParams
    from eagle3.stages.generate import compute_dtype

    served = GenerateParams.model_validate(
        {"backend": "openai", "openai": {"base_urls": ["http://127.0.0.1:9/v1"], "model": "m"}}
    )
    capability(cpu=True)
    assert compute_dtype(served) is None
    # The transformers fallback runs on the CPU even beside GPUs.
    fallback = GenerateParams.model_validate({"backend": "transformers"})
    capability(cpu=False, cuda=True)
    assert compute_dtype(fallback) == "float32"
