"""Training throughput: real shards through the DataLoader vs the same batches already in memory.

Both arms run the same optimizer steps of the real trainer (eagle3/training/: train_step, BatchPlan, collate)
from the same initial weights, in one process, alternating arms over several rounds; the data path's cost is
the ratio of the two. Needs a project whose `extract` and `vocab` stages have run (default: this directory).

    python benchmarks/train.py [--root .] [--steps 8] [--rounds 2] [--workers 1]
"""

import argparse
import copy
from pathlib import Path

import torch

from eagle3.formats.hf_weights import load_verifier_tensors
from eagle3.formats.provenance import read_provenance, verifier_dir
from eagle3.params.params_file import load_params
from eagle3.stages.train import build
from eagle3.training.data import BatchPlan, Collate, measure_aux_scale
from eagle3.training.distributed import Dist
from eagle3.training.objective import init_draft, make_objective, training_precision
from eagle3.training.optimizers import make_optimizer

from training_loop import timed_steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path("."))
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per arm and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1, help="DataLoader worker processes")
    args = parser.parse_args()
    root = args.root.resolve()
    whole = load_params(root / "params.yaml")
    config = whole.train
    provenance = read_provenance(root)
    draft_config, dataset, vocab = build(root, whole, provenance, Dist())
    collate = Collate.for_draft(draft_config)
    verifier = load_verifier_tensors(verifier_dir(root))
    initial = init_draft(draft_config, verifier, vocab.d2t, config.seed)
    initial.aux_scale.copy_(measure_aux_scale(dataset.first_states(), len(draft_config.aux_layer_ids)))
    lengths = dataset.lengths
    plan = list(BatchPlan(lengths, config.batch_size, config.epochs, config.seed))[: args.steps]

    def steps(batches) -> tuple[float, int]:
        draft = copy.deepcopy(initial)
        objective = make_objective(
            draft, verifier, vocab.d2t, vocab.t2d, config, training_precision(config, torch.device("cpu"))
        )
        return timed_steps(objective, make_optimizer(draft, config), batches, config)

    in_memory = [collate([dataset[i] for i in indices]) for indices in plan]
    totals = {"shards + DataLoader": [0.0, 0], "tensors in memory": [0.0, 0]}
    for _ in range(args.rounds):
        loader = torch.utils.data.DataLoader(
            dataset,
            batch_sampler=plan,
            collate_fn=collate,
            num_workers=args.workers,
            prefetch_factor=4 if args.workers else None,
        )
        for name, batches in (("shards + DataLoader", loader), ("tensors in memory", in_memory)):
            seconds, tokens = steps(batches)
            totals[name][0] += seconds
            totals[name][1] += tokens
    print(
        f"{args.steps} steps x {args.rounds} rounds, batch {config.batch_size}, ttt_steps {config.ttt_steps}, "
        f"precision {config.precision}, {args.workers} DataLoader worker(s)"
    )
    for name, (seconds, tokens) in totals.items():
        print(f"  {name:20s} {tokens / seconds:8.0f} padded tokens/s  ({seconds:.1f} s)")
    ratio = totals["shards + DataLoader"][0] / totals["tensors in memory"][0]
    print(f"data path cost: {100 * (ratio - 1):+.1f}% ({ratio:.3f}x the in-memory time; target <= +10%)")


if __name__ == "__main__":
    main()
