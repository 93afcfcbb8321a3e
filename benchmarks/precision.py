"""bfloat16 vs float32 on this machine: what `auto` (eagle3/precision.py) chooses between, measured side by side.

    python benchmarks/precision.py [--root .] [--prompts 64] [--max-tokens 64] [--steps 3] [--rounds 2]

One process, each arm alternating with the other over `--rounds` rounds:
  - a 1024 x 1024 matmul on one thread (GFLOP/s): the kernel-level gap;
  - vLLM greedy generation with the generate stage's backend (completion tokens/s; engine start not counted);
  - real training steps of the default draft (train_step on the project's shards, train.precision as each arm).
Prints each figure and the bfloat16 / float32 ratio (above 1: bf16 is faster), with the machine's ISA level, whether
oneDNN reports bf16 as native, and what `auto` resolves to here. Needs a project whose `extract` and `vocab`
stages have run (default: this directory); `--skip-generation` / `--skip-training` leave an arm out.
"""

import argparse
import json
import time
from pathlib import Path

import torch

from eagle3.engines.generation.base import TurnRequest, TurnResult
from eagle3.formats.hf_weights import load_verifier_tensors
from eagle3.formats.provenance import read_provenance, verifier_dir
from eagle3.params.generate import GenerateParams
from eagle3.params.params_file import load_params
from eagle3.precision import cpu_numerics, engine_device_type, resolve
from eagle3.stages.train import build
from eagle3.training.data import BatchPlan, Collate
from eagle3.training.distributed import Dist
from eagle3.training.objective import init_draft, make_objective
from eagle3.training.optimizers import make_optimizer

from training_loop import timed_steps

ARMS = ("bfloat16", "float32")


def matmul_gflops(dtype: torch.dtype, size: int = 1024, repeats: int = 5) -> float:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
        a @ b
        started = time.perf_counter()
        for _ in range(repeats):
            a @ b
        return 2 * size**3 * repeats / (time.perf_counter() - started) / 1e9
    finally:
        torch.set_num_threads(threads)


def generation_rates(root: Path, prompts: int, max_tokens: int, rounds: int) -> dict[str, float]:
    from eagle3.engines.generation.vllm_offline import VllmBackend

    rows = [json.loads(line) for line in (root / "data/prompts/eagle3-prompts.jsonl").read_text().splitlines()]
    stride = len(rows) // prompts
    requests = [
        TurnRequest(messages=[{"role": "user", "content": rows[i * stride]["conversations"][0]["value"]}], seed=0)
        for i in range(prompts)
    ]
    config = GenerateParams(
        chunk_size=prompts,
        sampling={"temperature": 0.0, "max_tokens": max_tokens},
        vllm={"max_model_len": 1024, "gpu_memory_utilization": 0.3, "cpu_kvcache_space_gib": 2, "enforce_eager": True},
    )
    provenance, model_dir = read_provenance(root), verifier_dir(root)
    totals = {arm: [0, 0.0] for arm in ARMS}
    for _ in range(rounds):
        for arm in ARMS:
            backend = VllmBackend(config, model_dir, provenance, arm)
            backend.generate(requests[:2])  # first-call allocations and kernel selection are not measured
            started = time.perf_counter()
            results = backend.generate(requests)
            totals[arm][1] += time.perf_counter() - started
            totals[arm][0] += sum(r.completion_tokens for r in results if isinstance(r, TurnResult))
            backend.close()
    return {arm: tokens / seconds for arm, (tokens, seconds) in totals.items()}


def training_step_seconds(root: Path, steps: int, rounds: int) -> tuple[dict[str, float], str]:
    whole = load_params(root / "params.yaml")
    params = whole.train
    provenance = read_provenance(root)
    draft_config, dataset, vocab = build(root, whole, provenance, Dist())
    verifier = load_verifier_tensors(verifier_dir(root))
    plan = list(BatchPlan(dataset.lengths, params.batch_size, 1, params.seed))[:steps]
    collate = Collate.for_draft(draft_config)
    batches = [collate([dataset[i] for i in indices]) for indices in plan]
    totals = dict.fromkeys(ARMS, 0.0)
    for _ in range(rounds):
        for arm in ARMS:
            config = params.model_copy(update={"precision": arm})
            draft = init_draft(draft_config, verifier, vocab.d2t, config.seed)
            objective = make_objective(draft, verifier, vocab.d2t, vocab.t2d, config, arm)
            totals[arm] += timed_steps(objective, make_optimizer(draft, config), batches, config)[0]
    padded = sum(batch["input_ids"].numel() for batch in batches) / len(batches)
    shape = (
        f"batch {params.batch_size} ({padded:.0f} padded tokens/step), ttt_steps {params.ttt_steps}, draft vocab "
        f"{draft_config.draft_vocab_size}"
    )
    return {arm: seconds / (steps * rounds) for arm, seconds in totals.items()}, shape


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path("."))
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3, help="training steps per arm and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--skip-generation", action="store_true")
    parser.add_argument("--skip-training", action="store_true")
    args = parser.parse_args()
    root = args.root.resolve()

    numerics = cpu_numerics()
    print(
        f"CPU capability {numerics['capability']}, bf16 native: {numerics['bf16_native']}, flags "
        f"{' '.join(numerics['flags']) or '-'}; auto resolves to {resolve('auto', engine_device_type())} for the "
        f"engines and {resolve('auto', 'cpu')} for CPU training",
        flush=True,
    )

    def report(what: str, unit: str, values: dict[str, float], higher_is_faster: bool) -> None:
        ratio = values["bfloat16"] / values["float32"] if higher_is_faster else values["float32"] / values["bfloat16"]
        print(
            f"{what:44s} bfloat16 {values['bfloat16']:9.2f} {unit:9s} float32 {values['float32']:9.2f} {unit:9s} "
            f"bf16 speed / fp32 speed {ratio:6.2f}x",
            flush=True,
        )

    report("matmul 1024^2, one thread", "GFLOP/s", {arm: matmul_gflops(getattr(torch, arm)) for arm in ARMS}, True)
    if not args.skip_generation:
        rates = generation_rates(root, args.prompts, args.max_tokens, args.rounds)
        report(f"vLLM greedy, {args.prompts} prompts x {args.max_tokens} tokens", "tok/s", rates, True)
    if not args.skip_training:
        seconds, shape = training_step_seconds(root, args.steps, args.rounds)
        report("training step", "s/step", seconds, False)
        print(f"  ({shape})")


if __name__ == "__main__":
    main()
