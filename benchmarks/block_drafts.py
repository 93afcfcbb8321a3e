"""Block drafts against the chain draft: `train.draft_method` dflash at several block sizes and depths beside the
EAGLE-3 draft, the same hidden states, the same epochs, the same evaluation, several seeds each; and a data-scaling
row (each method on a share of the training samples) that tells whether the method or the data limits it.

Each arm runs the real stages `train`, `export` and `evaluate` (eagle3 train/export/evaluate, one process each) in
a scratch project that links this project's verifier, prepared prompts, benchmark sets, hidden states and vocabulary
(benchmarks/scratch_project.py), with this project's params: evaluate at the arm's k (EAGLE-3: the params' headline
k; a block draft: its block size less one) beside the verifier alone, measured once. A data-scaling arm links a
share of the training shards (whole shards, in extract's order) through its own index of the hidden states. Arms
run one after another in this process, so their training speeds are comparable. Needs a project whose extract and
vocab stages have run (default: this directory).

Printed per arm, then per arm over seeds (mean, ± half the seeds' spread, ratio to the first arm): vLLM's tokens
per verifier step greedy on the held-out prompts, on each benchmark set and on the long-context probe, sampled at
evaluate.temperature, by prompt tokens; the offline estimate (chain, or the block's leading matches); draft
forwards per verifier step (a chain draft's k per drafting step, a block draft's one); training tokens/s and
seconds; acceptance and offline top-1 agreement by position.

    python benchmarks/block_drafts.py [--root .] [--arms eagle3 dflash-b4 dflash-b8 dflash-b16 dflash-b8-l3]
        [--shares 1.0] [--seeds 0 1 2] [--json results.json]
"""

import argparse
import json
import tempfile
from pathlib import Path

import yaml
from scratch_project import evaluate, evaluate_at_k, keep, link, measure, run_stage, summary

from eagle3.files import read_json, write_json
from eagle3.paths import BENCHMARKS_DIR, HIDDEN_DIR, HIDDEN_INDEX, PREPARED_DIR, SYNTHETIC_DIR, VERIFIER_DIR, VOCAB_DIR

LINKED = (VERIFIER_DIR, PREPARED_DIR, BENCHMARKS_DIR, SYNTHETIC_DIR, VOCAB_DIR)
# train settings of each arm beyond the project's own (its anchors: train.dflash's default).
ARMS = {
    "eagle3": {"draft_method": "eagle3"},
    "dflash-b4": {"draft_method": "dflash", "dflash": {"layers": 1, "block_size": 4}},
    "dflash-b8": {"draft_method": "dflash", "dflash": {"layers": 1, "block_size": 8}},
    "dflash-b16": {"draft_method": "dflash", "dflash": {"layers": 1, "block_size": 16}},
    "dflash-b8-l3": {"draft_method": "dflash", "dflash": {"layers": 3, "block_size": 8}},
}


def link_hidden_states(root: Path, work: Path, share: float) -> int:
    """data/hidden of `work`: every file of `root`'s linked, the index rewritten to list the first `share` of the
    training shards (at least one). Returns the training shards listed."""
    source, target = root / HIDDEN_DIR, work / HIDDEN_DIR
    for path in source.rglob("*"):
        if path.is_file() and path != root / HIDDEN_INDEX:
            (target / path.relative_to(source)).parent.mkdir(parents=True, exist_ok=True)
            (target / path.relative_to(source)).symlink_to(path)
    index = read_json(root / HIDDEN_INDEX, "run `dvc repro extract` first")
    train = index["splits"]["train"]
    kept = max(1, round(share * len(train)))
    write_json(work / HIDDEN_INDEX, {**index, "splits": {**index["splits"], "train": train[:kept]}})
    return kept


def arm(root: Path, base: dict, name: str, share: float, seed: int, scratch: Path) -> dict:
    label = name if share == 1.0 else f"{name}@{share:g}"
    work = scratch / f"{label}-seed{seed}"
    link(root, work, LINKED)
    shards = link_hidden_states(root, work, share)
    params = json.loads(json.dumps(base))
    train = {**params["train"], **ARMS[name], "seed": seed}
    params["train"] = train
    if train["draft_method"] == "dflash":
        k = train["dflash"]["block_size"] - 1
        params["evaluate"] = evaluate_at_k(params, "dflash", k)
        params["export"] = {**params["export"], "num_speculative_tokens": k}
    else:
        params["evaluate"] = evaluate_at_k(params, "eagle3", params["evaluate"]["headline_k"])
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    train_s = run_stage(work, "train")
    run_stage(work, "export")
    evaluate(work, scratch / "reference")
    return {"arm": label, "seed": seed, "train_shards": shards, **measure(work, train_s)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path("."))
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    parser.add_argument(
        "--shares", nargs="+", type=float, default=[1.0], help="shares of the training shards each arm trains on"
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    root = args.root.resolve()
    base = yaml.safe_load((root / "params.yaml").read_text(encoding="utf-8"))
    results = []
    with tempfile.TemporaryDirectory(prefix="eagle3-block-drafts-") as scratch:
        for seed in args.seeds:
            for share in args.shares:
                for name in args.arms:
                    keep(results, arm(root, base, name, share, seed, Path(scratch)), args.json)
    print("\n" + "\n".join(summary(results)))


if __name__ == "__main__":
    main()
