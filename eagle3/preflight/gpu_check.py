"""`make gpu-check`: what only a GPU can show, in one offline command, before anything costly runs on a rented
machine (docs/hero-run.md runs it there). Its steps' time boxes add up to its longest run (`total_limit_s`);
each box is the step's work timed on a CPU where a CPU can do it, plus a stated allowance for what only the GPU
does, and benchmarks/README.md ("gpu-check time boxes") has the figures behind each.

Each step runs in its own process group under its own box, the next one starts whatever the last one did, and
each ends in one summary line saying what it proves; the log of each is in .eagle3/gpu-check/<step>.log and the
summary in .eagle3/gpu-check/summary.json. A step over its box has every Python process it started print its
threads' stacks (faulthandler, on SIGABRT) into its log; the summary shows where the step's own process was. Nothing
is downloaded: the verifiers are built locally from configs (a small Llama, the Kimi-shaped MLA + MoE miniature of
tests/kimi_miniature.py) or converted from the PyPI wheel the project embeds. Without CUDA the GPU steps report
that they need it and the others run, which is how CI runs this command.

    python -m eagle3.preflight.gpu_check              # every step
    python -m eagle3.preflight.gpu_check --only preflight
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
            "the attention kernels against fp64; a training step with each recompute, with AdamW and with Muon (both "
            "shipped configurations train with Muon); resume continuing as the uninterrupted run (bit for bit under "
            "deterministic algorithms); the MLA draft layer's step against the CPU's; the hf capture on the GPU "
            "against the CPU; NCCL + FSDP2 + a checkpoint round trip on one rank",
            [_pytest("tests/test_gpu.py")],
            120,
        ),
        Step(
            "training at scale",
            "a training step at Kimi-K2.5's draft shape with the shipped configuration's settings (Muon, TTT 7, draft "
            "vocabulary 32,000) at 2K, 8K and 16K tokens: the real peak within the fake-tensor estimate the plan and "
            "`eagle3 check` use, and tokens/s",
            [_pytest("tests/test_gpu_training_scale.py")],
            90,
        ),
        Step(
            "extraction",
            "the project's vLLM capture, its engine compiled with CUDA graphs as the stages start it, on the "
            "Kimi-shaped MLA + MoE miniature at 17, 3,000 and 20,000 tokens against HF in float32, every position, "
            "through vLLM's connector on its CUDA path (locks and writer threads)",
            [_pytest("tests/test_extract_chunked.py")],
            180,
        ),
        Step(
            "proposals",
            "vLLM's Model Runner V2 (what `vllm serve` runs on CUDA) proposes, from a real verifier's captured "
            "states, the tokens the project's own draft forward proposes",
            [_pytest("tests/test_draft_in_vllm.py")],
            75,
        ),
        Step(
            "evaluate engine",
            "the evaluate stage's vLLM engine, compiled with CUDA graphs, with an exported draft at k=3 behind the "
            "Kimi-shaped miniature, MLA on (bf16, Model Runner V2), for the Llama-style and the MLA draft layer: each "
            "drafts three tokens per step and answers as the verifier alone does",
            [_pytest("tests/test_evaluate_child.py")],
            240,
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


def total_limit_s() -> int:
    """The longest the whole command takes: every box spent."""
    return sum(step.limit_s for step in steps())


def prepare_project(out: Path) -> None:
    """The smoke params in their own directory: the verifier stage converts the embedded verifier there."""
    project = out / "project"
    project.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(REPO / "tests" / "smoke" / "params.yaml", project / "params.yaml")


# How long the processes of a step over its box get to print their stacks before they are killed.
STACK_GRACE_S = 10


def run_step(step: Step, cuda: bool, out: Path) -> dict:
    if step.needs_cuda and not cuda:
        return {"step": step.name, "result": "needs CUDA", "seconds": 0.0, "proves": step.proves}
    log = out / f"{step.name.replace(' ', '-')}.log"
    # Every Python process of the step prints its threads' stacks when aborted (a hang's only trace).
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONFAULTHANDLER": "1"}
    started, result, stack = time.monotonic(), "passed", None
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
                _stop_with_stacks(process)
                result = f"failed (over its {step.limit_s} s)"
                stack = stack_of_hang(log)
                break
            if code != 0:
                result = f"failed (exit {code}: {' '.join(command[1:3])})"
                break
    seconds = round(time.monotonic() - started, 1)
    outcome = {"step": step.name, "result": result, "seconds": seconds, "proves": step.proves, "log": str(log)}
    return {**outcome, "stack": stack} if stack else outcome


def _stop_with_stacks(process: subprocess.Popen) -> None:
    """SIGABRT to the step's process group (faulthandler prints each process's stacks), then SIGKILL to what is
    left after the grace period."""
    try:
        os.killpg(process.pid, signal.SIGABRT)
        process.wait(timeout=STACK_GRACE_S)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def stack_of_hang(log: Path, frames: int = 12) -> list[str]:
    """The innermost frames of the thread that was running when the step's first process was aborted, as
    faulthandler printed them into the log (most recent call first); [] if it printed none."""
    lines = log.read_text(errors="replace").splitlines()
    aborted = [n for n, line in enumerate(lines) if line.startswith("Fatal Python error: Aborted")]
    if not aborted:
        return []
    stack = []
    for line in lines[aborted[0] + 1 :]:
        if line.startswith("  File "):
            stack.append(line.strip())
        elif stack and not line.strip():
            break
    return stack[:frames]


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
        for frame in outcome.get("stack", []):
            print(f"    {frame}", flush=True)
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
