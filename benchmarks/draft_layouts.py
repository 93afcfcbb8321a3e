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
import statistics
import tempfile
from pathlib import Path

import yaml
from scratch_project import link, run_stage

from eagle3.paths import (
    BENCHMARKS_DIR,
    EVAL_METRICS,
    HIDDEN_DIR,
    PREPARED_DIR,
    SYNTHETIC_DIR,
    TRAIN_LOG_DIR,
    VERIFIER_DIR,
    VOCAB_DIR,
)

LINKED = (VERIFIER_DIR, PREPARED_DIR, BENCHMARKS_DIR, SYNTHETIC_DIR, HIDDEN_DIR, VOCAB_DIR)
LAYOUTS = {
    "2024": {},
    "eagle3.1": {"fc_norm": True, "norm_output": True},
    "speculators": {"norm_before_fc": True, "norm_output": True, "norm_before_residual": True},
}
# Recipe differences from speculators' trainer, tried on a layout: its output head frozen at the verifier's rows,
# its AdamW beta2.
RECIPES = {"default": {}, "frozen-head": {"freeze_lm_head": True}, "beta2-0.999": {"adam_beta2": 0.999}}
K = 3


def arm(root: Path, base: dict, layout: str, recipe: str, seed: int, scratch: Path) -> dict:
    name = layout if recipe == "default" else f"{layout}+{recipe}"
    work = scratch / f"{name}-seed{seed}"
    link(root, work, LINKED)
    params = json.loads(json.dumps(base))
    params["train"] = {**params["train"], **RECIPES[recipe], "seed": seed, "draft_layout": LAYOUTS[layout]}
    params["evaluate"] = {**params["evaluate"], "methods": ["none", "eagle3"], "num_speculative_tokens": [K]}
    params["evaluate"]["headline_k"] = K
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    train_s = run_stage(work, "train")
    run_stage(work, "export")
    run_stage(work, "evaluate")
    metrics = json.loads((work / EVAL_METRICS).read_text())
    training = json.loads((work / TRAIN_LOG_DIR / "metrics.json").read_text())
    runs = {(r["method"], r["temperature"]): r for r in metrics["runs"] if r["method"] == "eagle3"}
    sampled = next(r for (method, t), r in runs.items() if t > 0)
    greedy = runs[("eagle3", 0.0)]
    long_context = next(
        r for r in metrics["long_context"]["results"] if r["method"] == "eagle3" and r["temperature"] == 0
    )
    offline = metrics["offline_estimate"]
    return {
        "layout": name,
        "seed": seed,
        "heldout": metrics["headline"]["tokens_per_step_greedy"],
        **{name: entry["tokens_per_step"] for name, entry in metrics["headline"]["benchmarks"].items()},
        "heldout_sampled": sampled["tokens_per_step"],
        "long_context": long_context["tokens_per_step"],
        "lossless": metrics["headline"]["lossless_greedy"],
        "offline": offline["tokens_per_step"],
        "offline_top1": offline["top1_agreement_by_position"],
        "offline_by_context": {
            f"{b['from_tokens']}-{b['to_tokens']}": (b["mean_acceptance_length"], b["drafts"])
            for b in offline["acceptance_by_context"]
        },
        "vllm_by_context": {
            f"{b['from_tokens']}-{b['to_tokens']}": (b["tokens_per_step"], b["completions"])
            for b in greedy["all_sets_by_context"]
        },
        "train_tokens_per_s": training["tokens_per_s_this_run"],
        "train_s": round(train_s, 1),
    }


def _cell(values: list[float]) -> str:
    mean = statistics.fmean(values)
    return f"{mean:.4f} (±{(max(values) - min(values)) / 2:.4f})" if len(values) > 1 else f"{mean:.4f}"


def summary(results: list[dict]) -> list[str]:
    """Per layout: the mean over seeds, ± half the seeds' spread; the ratio to the first layout's mean."""
    layouts = list(dict.fromkeys(r["layout"] for r in results))
    by_layout = {name: [r for r in results if r["layout"] == name] for name in layouts}
    tables = {"offline_by_context", "vllm_by_context"}
    sets = [k for k in results[0] if k not in {"layout", "seed", "lossless", "offline_top1"} | tables]
    lines = ["layout | seeds | " + " | ".join(sets) + " | offline top-1 by position"]
    first = by_layout[layouts[0]]
    for name, arms in by_layout.items():
        cells = []
        for key in sets:
            values = [r[key] for r in arms]
            baseline = statistics.fmean(r[key] for r in first)
            cells.append(f"{_cell(values)} x{statistics.fmean(values) / baseline:.3f}")
        top1 = [statistics.fmean(r["offline_top1"][i] for r in arms) for i in range(K)]
        lines.append(f"{name} | {len(arms)} | " + " | ".join(cells) + " | " + " / ".join(f"{a:.3f}" for a in top1))
    for key, what, counted in (
        ("vllm_by_context", "vLLM tokens per step (k=3 greedy, every set's turns) by prompt tokens", "turns"),
        ("offline_by_context", "offline mean acceptance length by context tokens", "drafts"),
    ):
        lines.append("")
        buckets = sorted({b for r in results for b in r[key]}, key=lambda b: int(b.split("-")[0]))
        lines.append(f"layout | {what}: " + " | ".join(buckets))
        for name, arms in by_layout.items():
            cells = []
            for bucket in buckets:
                values = [r[key][bucket][0] for r in arms if bucket in r[key]]
                count = sum(r[key].get(bucket, (0, 0))[1] for r in arms)
                cells.append(f"{_cell(values)} ({count} {counted})" if values else "n/a")
            lines.append(f"{name} | " + " | ".join(cells))
    return lines


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
                    results.append(arm(root, base, layout, recipe, seed, Path(scratch)))
                    print(json.dumps(results[-1]), flush=True)
                    if args.json:
                        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print("\n" + "\n".join(summary(results)))


if __name__ == "__main__":
    main()
