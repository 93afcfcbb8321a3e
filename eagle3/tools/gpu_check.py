"""`make gpu-check`: what only a GPU can show, in one offline command of at most 9 minutes (the steps' limits add
up to that), before anything costly runs on a rented machine (docs/hero-run.md runs it there).

Each step runs in its own process under its own time limit, the next one starts whatever the last one did, and
each ends in one summary line; the log of each is in .eagle3/gpu-check/<step>.log and the summary in
.eagle3/gpu-check/summary.json. Nothing is downloaded: the verifiers are built locally from configs (a small
Llama, the Kimi-shaped MLA + MoE miniature of tests/kimi_miniature.py) or converted from the PyPI wheel the
project embeds. Without CUDA the GPU steps report that they need it and the others run, which is how CI runs
this command.

    python -m eagle3.tools.gpu_check              # every step
    python -m eagle3.tools.gpu_check --only preflight
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from eagle3.files import write_json

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / ".eagle3" / "gpu-check"  # the default of --out


@dataclass(frozen=True)
class Step:
    name: str
    proves: str
    commands: list[list[str]]  # run in turn; the step fails at the first that fails
    limit_s: int
    needs_cuda: bool = True
    cwd: Path = REPO


def _pytest(*selection: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:xdist", "-m", "gpu", *selection]


def steps(out: Path = OUT) -> list[Step]:
    project = out / "project"
    cli = [sys.executable, "-m", "eagle3.cli"]
    return [
        Step(
            "kernels",
            "the attention kernels against fp64, a training step with each recompute, bit-identical resume, the hf "
            "capture on the GPU against the CPU, NCCL + FSDP2 + a checkpoint round trip on one rank",
            [_pytest("tests/test_gpu.py")],
            60,
        ),
        Step(
            "extraction",
            "the project's vLLM capture on the Kimi-shaped MLA + MoE miniature at 17, 3,000 and 20,000 tokens "
            "against HF in float32, every position, with the stage's own engine settings",
            [_pytest("tests/test_extract_chunked.py")],
            120,
        ),
        Step(
            "proposals",
            "vLLM's Model Runner V2 (what `vllm serve` runs on CUDA) proposes, from a real verifier's captured "
            "states, the tokens the project's own draft forward proposes",
            [_pytest("tests/test_draft_in_vllm.py")],
            60,
        ),
        Step(
            "training memory",
            "a training step at Kimi-K2.5's draft shape (hidden 7,168, draft vocabulary 32,000, TTT 7) at 2K, 8K "
            "and 16K tokens: the real peak beside the fake-tensor estimate the plan uses, and tokens/s",
            [
                [sys.executable, "benchmarks/train_memory.py", "--rows", "2048x7", "8192x7", "16384x7"],
                [sys.executable, "benchmarks/train_gpu.py", "--tokens", "2048", "8192", "16384", "--arms", "mlp"],
            ],
            60,
        ),
        Step(
            "evaluate engine",
            "the evaluate stage's vLLM engine with an exported draft at k=3 behind the Kimi-shaped miniature, MLA on "
            "(bf16, Model Runner V2): it drafts three tokens per step and answers as the verifier alone does",
            [_pytest("tests/test_evaluate_child.py")],
            90,
        ),
        Step(
            "preflight",
            "the verifier stage and `eagle3 preflight` on the smoke params (CPU or GPU): engines start, extraction "
            "and training rates, disk",
            [[*cli, "verifier"], [*cli, "preflight"]],
            150,
            needs_cuda=False,
            cwd=project,
        ),
    ]


def prepare_project(out: Path) -> None:
    """The smoke params in their own directory: the verifier stage converts the embedded verifier there."""
    project = out / "project"
    project.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(REPO / "tests" / "smoke" / "params.yaml", project / "params.yaml")


def run_step(step: Step, cuda: bool, out: Path) -> dict:
    if step.needs_cuda and not cuda:
        return {"step": step.name, "result": "needs CUDA", "seconds": 0.0, "proves": step.proves}
    log = out / f"{step.name.replace(' ', '-')}.log"
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    started, result = time.monotonic(), "passed"
    with log.open("w") as output:
        for command in step.commands:
            left = step.limit_s - (time.monotonic() - started)
            # Its own process group: a time limit stops the engines and workers it started too.
            process = subprocess.Popen(
                command, cwd=step.cwd, stdout=output, stderr=subprocess.STDOUT, env=environment, start_new_session=True
            )
            try:
                code = process.wait(timeout=max(left, 1))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                result = f"failed (over its {step.limit_s} s)"
                break
            if code != 0:
                result = f"failed (exit {code}: {' '.join(command[1:3])})"
                break
    seconds = round(time.monotonic() - started, 1)
    return {"step": step.name, "result": result, "seconds": seconds, "proves": step.proves, "log": str(log)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=[s.name for s in steps()], help="these steps only")
    parser.add_argument("--out", type=Path, default=OUT, help=f"logs, summary and scratch project (default {OUT})")
    args = parser.parse_args(argv)
    import torch

    cuda = torch.cuda.is_available()
    device = torch.cuda.get_device_name(0) if cuda else "no CUDA device"
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    prepare_project(out)
    results = []
    for step in steps(out):
        if args.only and step.name not in args.only:
            continue
        outcome = run_step(step, cuda, out)
        results.append(outcome)
        print(f"gpu-check: {step.name}: {outcome['result']} ({outcome['seconds']:g} s): {step.proves}", flush=True)
    failed = [r["step"] for r in results if r["result"].startswith("failed")]
    write_json(out / "summary.json", {"device": device, "steps": results, "failed": failed})
    print(
        f"gpu-check on {device}: {len(results) - len(failed)} of {len(results)} steps without failure"
        + (f"; failed: {', '.join(failed)} (logs in {out})" if failed else ""),
        flush=True,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
