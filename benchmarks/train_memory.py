"""Training memory at the hero run's length: the GPU-free estimate (eagle3/training/memory.py: the real train_step on
fake tensors) per tokens x TTT steps and train.activation_checkpointing setting, beside the real peak
(`torch.cuda.max_memory_allocated` of the second of two real steps) where a GPU is present.

The draft is shaped as the train stage shapes it from a verifier config: Kimi-K2.5's language model by default
(64 heads x 128, MLP 18432, 1.19B parameters at draft vocab 32,000), or a model directory's config.json
(`--verifier DIR`). bf16 autocast, fused AdamW, batch 1. A second table splits one process's memory at the
longest row over `--processes` under each train.sharding.

    python benchmarks/train_memory.py                                   # the README table (any machine)
    python benchmarks/train_memory.py --rows 16384x7 --processes 8       # one row, and 8 processes
"""

import argparse
import json
from pathlib import Path

import torch

from eagle3.params.train import RECOMPUTE, TrainParams
from eagle3.plan.facts import KIMI_K2_5_TEXT_CONFIG
from eagle3.training.distributed import Dist
from eagle3.training.memory import Estimator, GiB, draft_config_for, make_objective_for, sample_batch
from eagle3.training.objective import train_step
from eagle3.training.optimizers import make_optimizer

ROWS = ["2048x7", "4096x7", "8192x7", "16384x1", "16384x3", "16384x7"]


def measured_peak(estimator: Estimator, tokens: int, recompute: str) -> float | None:
    """GiB torch.cuda.max_memory_allocated reports over the second real step; None without a GPU or when it runs
    out of memory."""
    if not torch.cuda.is_available():
        return None
    device = torch.device("cuda")
    try:
        objective = make_objective_for(estimator.config, estimator.ttt_steps, recompute, "bfloat16").to(device)
        optimizer = make_optimizer(objective.draft, TrainParams())
        batch = {k: v.to(device) for k, v in sample_batch(estimator.config, 1, tokens, estimator.ttt_steps).items()}
        world = Dist(device=device)
        for step in range(2):
            if step == 1:
                torch.cuda.reset_peak_memory_stats(device)
            train_step(objective, objective, optimizer, [batch], world, 1.0, "bfloat16")
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) / GiB
    except torch.OutOfMemoryError:
        return None
    finally:
        objective = optimizer = batch = None
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verifier", type=Path, help="a verifier model directory (its config.json)")
    parser.add_argument("--draft-vocab", type=int, default=32000)
    parser.add_argument("--rows", nargs="+", default=ROWS, help="TOKENSxTTT_STEPS (default: the README's rows)")
    parser.add_argument("--processes", type=int, default=8, help="processes of the second table (default 8)")
    args = parser.parse_args()
    config = KIMI_K2_5_TEXT_CONFIG
    if args.verifier is not None:
        config = json.loads((args.verifier / "config.json").read_text(encoding="utf-8"))
    draft = draft_config_for(config, args.draft_vocab)
    rows = [tuple(int(part) for part in row.split("x")) for row in args.rows]
    estimators: dict[int, Estimator] = {}  # by TTT steps
    cuda = torch.cuda.get_device_name() if torch.cuda.is_available() else "none (estimates only)"
    print(
        f"draft: hidden {draft.hidden_size}, {draft.num_attention_heads} heads x {draft.head_dim}, MLP "
        f"{draft.intermediate_size}, draft vocab {draft.draft_vocab_size}; bf16 autocast, fused AdamW, batch 1; "
        f"GPU: {cuda}"
    )
    print(f"{'tokens x TTT':>14} " + " ".join(f"{name:>16}" for name in RECOMPUTE) + "   (GiB: estimate / measured)")
    for tokens, steps in rows:
        estimator = estimators.setdefault(steps, Estimator(draft, steps))
        cells = []
        for recompute in RECOMPUTE:
            estimate = estimator.memory(tokens, recompute).total / GiB
            measured = measured_peak(estimator, tokens, recompute)
            cells.append(f"{estimate:.1f} / {'n/a' if measured is None else f'{measured:.1f}'}")
        print(f"{f'{tokens:,} x {steps}':>14} " + " ".join(f"{cell:>16}" for cell in cells))
    tokens, steps = rows[-1]
    estimator = estimators[steps]
    print(f"trainable parameters: {sum(p.numel() for p in estimator.parameters) / 1e9:.3f}B")
    print(f"\none of {args.processes} processes at {tokens:,} x {steps} (GiB)")
    parts = ("weights", "optimizer", "gradient_buckets", "gathered", "frozen", "batch", "step")
    print(
        f"{'sharding':>9} {'recompute':>9} " + " ".join(f"{p:>16}" for p in parts) + f" {'persistent':>10} {'total':>6}"
    )
    for recompute in RECOMPUTE:
        batch, step = estimator.step_bytes(tokens, recompute)
        for sharding in ("ddp", "fsdp"):
            memory = estimator.split(tokens, recompute, batch, step, args.processes, sharding)
            values = " ".join(f"{getattr(memory, p) / GiB:>16.2f}" for p in parts)
            print(f"{sharding:>9} {recompute:>9} {values} {memory.persistent / GiB:>10.2f} {memory.total / GiB:>6.1f}")


if __name__ == "__main__":
    main()
