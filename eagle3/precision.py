"""Compute precision: the floating-point type a stage computes with the verifier or the draft in.

Where the hardware computes bf16 natively (a CUDA GPU with bf16 arithmetic; a CPU whose oneDNN reports native
bf16 and that has the units to make it fast: AMX, or AMD's AVX-512 BF16) bf16 is the fast choice; elsewhere
(AVX2-only CPUs: AMD Zen 2/3, most laptops) every bf16 operation is emulated and far slower than float32
(`benchmarks/precision.py` prints the ratios on the machine it runs on). An Intel CPU with AVX-512 BF16 but no AMX
(seen on a virtual Xeon whose AMX the hypervisor hides) is neither: oneDNN computes bf16 there, at about half
float32's rate (`eagle3 preflight` measures both), so it counts as not native. `auto` therefore means bfloat16
where native, float32 otherwise.

It is a capability check, not a timing: the resolved value changes what a stage produces, so it enters the
stage's run key and must come out the same on every run on one machine. What is stored stays independent of
it: the verifier stage's converted weights (`verifier.dtype`), extract's shards (bf16 always), checkpoints
(fp32 weights).

No torch at import: params modules take the value types from here and loading params stays light.
"""

from typing import Any, Literal

AUTO = "auto"
# What a verifier engine (vLLM, transformers) computes in: generate.dtype, extract.dtype, evaluate.vllm.dtype.
EngineDtype = Literal["auto", "bfloat16", "float16", "float32"]
# What training autocasts to (train.precision); float16 would need loss scaling, which the trainer does not do.
TrainPrecision = Literal["auto", "bfloat16", "float32"]
# CPU flags that decide bf16 speed and numerics, as /proc/cpuinfo names them.
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def native_bf16(device_type: str) -> bool:
    """Whether `device_type` ("cpu" or "cuda") computes bf16 in hardware."""
    import torch

    if device_type == "cuda":
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False
    return "amx_bf16" in _cpu_flags() or _cpu_vendor() != "GenuineIntel"


def resolve(requested: str, device_type: str) -> str:
    """The dtype name a setting means on `device_type`: explicit values as given, `auto` by native_bf16."""
    if requested != AUTO:
        return requested
    return "bfloat16" if native_bf16(device_type) else "float32"


def engine_device_type() -> str:
    """Where the vLLM engines and the hf capture run: the GPUs when there are any."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def cpu_numerics() -> dict[str, Any]:
    """What decides a CPU's speed and rounding in these stages, for the environment record: the ISA level torch
    dispatches to, whether bf16 is native, and the relevant CPU flags present."""
    import torch

    return {
        "capability": torch.backends.cpu.get_cpu_capability(),
        "bf16_native": native_bf16("cpu"),
        "flags": [flag for flag in CPU_FLAGS if flag in _cpu_flags()],
    }


def _cpu_flags() -> set[str]:
    return set(_cpuinfo_field("flags").split())


def _cpu_vendor() -> str:
    return _cpuinfo_field("vendor_id")


def _cpuinfo_field(name: str) -> str:
    """The first CPU's `name` line in /proc/cpuinfo; empty where there is none (another OS)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() == name:
                    return value.strip()
    except OSError:
        pass
    return ""
