"""Training step time: AdamW's per-parameter loop (the baseline) vs its fused kernel, at two draft vocab sizes.

Every arm runs the real training step (eagle3/training/objective.py: train_step) on the
same batches of the project's shards from the same initial weights, in one process, alternating arms over
several rounds; ratios are against the first arm. The vocabulary-sized work (lm_head, soft cross-entropy
against the verifier's distribution) is most of a step, which is why the vocab size is one of the arms.
Each vocab is built as the vocab stage builds it (eagle3/stages/vocab.py). Needs a project whose `extract` and
`vocab` stages have run (default: this directory).

    python benchmarks/train_step.py [--root .] [--steps 6] [--rounds 2] [--vocab 8192 4096]
"""

import argparse
from dataclasses import replace
from pathlib import Path

import torch

from eagle3.chat.sequence_plan import load_tokenizer, synthetic_parts
from eagle3.formats.hf_weights import load_verifier_tensors
from eagle3.formats.provenance import read_provenance, verifier_dir
from eagle3.params.params_file import load_params
from eagle3.stages.train import build
from eagle3.stages.vocab import count_tokens, mapping, select
from eagle3.training.data import BatchPlan, Collate
from eagle3.training.distributed import Dist
from eagle3.training.objective import init_draft, make_objective, training_precision
from eagle3.training.optimizers import make_optimizer

from training_loop import timed_steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path("."))
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps per arm and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--vocab", type=int, nargs="+", default=[8192, 4096], help="draft vocab sizes")
    args = parser.parse_args()
    root = args.root.resolve()
    whole = load_params(root / "params.yaml")
    config = whole.train
    provenance = read_provenance(root)
    draft_config, dataset, _ = build(root, whole, provenance, Dist())
    collate = Collate.for_draft(draft_config)
    parts, tokenizer = synthetic_parts(root, ["train"]), load_tokenizer(root, provenance)
    token_counts = count_tokens(root, parts, tokenizer, whole.extract.max_seq_len, provenance.vocab_size)
    verifier = load_verifier_tensors(verifier_dir(root))
    plan = list(BatchPlan(dataset.lengths, config.batch_size, 1, config.seed))[: args.steps]
    batches = [collate([dataset[i] for i in indices]) for indices in plan]
    tokens = sum(batch["input_ids"].numel() for batch in batches)

    def per_parameter_adamw(draft):
        return torch.optim.AdamW(
            draft.parameters(),
            lr=config.learning_rate,
            betas=(0.9, 0.95),
            weight_decay=config.weight_decay,
            foreach=False,
        )

    def fused_adamw(draft):
        return make_optimizer(draft, config)

    def steps(size: int, optimizer_factory) -> float:
        d2t, t2d = mapping(select(*token_counts, size), provenance.vocab_size)
        draft = init_draft(replace(draft_config, draft_vocab_size=size), verifier, d2t, config.seed)
        objective = make_objective(draft, verifier, d2t, t2d, config, training_precision(config, torch.device("cpu")))
        return timed_steps(objective, optimizer_factory(draft), batches, config)[0]

    arms = [
        (size, name, factory)
        for size in args.vocab
        for name, factory in (("per-parameter AdamW", per_parameter_adamw), ("fused AdamW", fused_adamw))
    ]
    totals = [0.0] * len(arms)
    for _ in range(args.rounds):
        for number, (size, _, factory) in enumerate(arms):
            totals[number] += steps(size, factory)
    print(
        f"{args.steps} steps x {args.rounds} rounds, batch {config.batch_size} ({tokens / len(batches):.0f} padded "
        f"tokens/step), ttt_steps {config.ttt_steps}, precision {training_precision(config, torch.device('cpu'))}"
    )
    for (size, name, _), seconds in zip(arms, totals, strict=True):
        per_step = seconds / (args.steps * args.rounds)
        print(f"  draft vocab {size:6d}, {name:20s} {per_step:6.3f} s/step  {totals[0] / seconds:5.2f}x")


if __name__ == "__main__":
    main()
