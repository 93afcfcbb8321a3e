"""Draft layouts side by side: the same data, the same training steps, the same evaluation, two or more seeds each.

Each arm is a `train.draft_layout` (the 2024 EAGLE-3 layout, EAGLE 3.1's fc_norm + norm_output, speculators'
default norm_before_fc + norm_output + norm_before_residual) at a `train.seed`. It runs the real stages `train`,
`export` and `evaluate` (eagle3 train/export/evaluate, one process each) in a scratch project that links this
project's verifier, prepared prompts, benchmark sets, hidden states and vocabulary, with this project's params
(evaluate at k=3 only, without the n-gram baseline, which does not depend on the draft). Arms run one after
another in this process, so their training speeds are comparable. Needs a project whose extract and vocab stages
have run (default: this directory).

Printed per arm, then per layout (mean over seeds, and the seeds' spread): vLLM's tokens per verifier step at
k=3 greedy on the held-out prompts, on each benchmark set and on the long-context probe (evaluate.long_context),
sampled at evaluate.temperature, and by prompt tokens over every set's turns; the lossless count; the offline
estimate's tokens per step, its top-1 agreement at each draft position and its mean acceptance length by context
length; training tokens/s.

`--recipes` adds speculators' recipe differences on each layout: the output head frozen at the verifier's rows
(train.freeze_lm_head), AdamW's beta2 at 0.999 (train.adam_beta2).

    python benchmarks/draft_layouts.py [--root .] [--layouts 2024 eagle3.1 speculators] [--seeds 0 1]
        [--recipes default frozen-head beta2-0.999] [--json results.json]
"""

import argparse
import json
import tempfile
from pathlib import Path

import yaml
from scratch_project import evaluate, evaluate_at_k, keep, link, measure, run_stage, summary

from eagle3.params.train import EAGLE_3_1
from eagle3.paths import BENCHMARKS_DIR, HIDDEN_DIR, PREPARED_DIR, SYNTHETIC_DIR, VERIFIER_DIR, VOCAB_DIR

LINKED = (VERIFIER_DIR, PREPARED_DIR, BENCHMARKS_DIR, SYNTHETIC_DIR, HIDDEN_DIR, VOCAB_DIR)
LAYOUTS = {
    "2024": {},
    "eagle3.1": EAGLE_3_1.model_dump(),
    "speculators": {"norm_before_fc": True, "norm_output": True, "norm_before_residual": True},
}
# Recipe differences from speculators' trainer, tried on a layout: its output head frozen at the verifier's rows,
# its AdamW beta2.
RECIPES = {"default": {}, "frozen-head": {"freeze_lm_head": True}, "beta2-0.999": {"adam_beta2": 0.999}}


def arm(root: Path, base: dict, layout: str, recipe: str, seed: int, scratch: Path) -> dict:
    name = layout if recipe == "default" else f"{layout}+{recipe}"
    work = scratch / f"{name}-seed{seed}"
    link(root, work, LINKED)
    params = json.loads(json.dumps(base))
    params["train"] = {**params["train"], **RECIPES[recipe], "seed": seed, "draft_layout": LAYOUTS[layout]}
    params["evaluate"] = evaluate_at_k(params)
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    train_s = run_stage(work, "train")
    run_stage(work, "export")
    evaluate(work, scratch / "reference")
    return {"arm": name, "seed": seed, **measure(work, train_s)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path("."))
    parser.add_argument("--layouts", nargs="+", choices=sorted(LAYOUTS), default=list(LAYOUTS))
    parser.add_argument("--recipes", nargs="+", choices=list(RECIPES), default=["default"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    root = args.root.resolve()
    base = yaml.safe_load((root / "params.yaml").read_text(encoding="utf-8"))
    results = []
    with tempfile.TemporaryDirectory(prefix="eagle3-layouts-") as scratch:
        for seed in args.seeds:
            for layout in args.layouts:
                for recipe in args.recipes:
                    keep(results, arm(root, base, layout, recipe, seed, Path(scratch)), args.json)
    print("\n" + "\n".join(summary(results)))


if __name__ == "__main__":
    main()
