"""This project's trainer beside speculators' (the peer trainer users compare it with) at the same budget, on this
project's own data, every draft measured by this project's own evaluate stage.

Arms, each at every --seeds:
  peer         speculators 0.9.0's trainer (benchmarks/speculators_peer.py: its own venv, patched for CPU) with
               its own defaults (Muon with AdamW, its layout, its output head frozen at the verifier's rows, KL to
               the verifier, uniform TTT weights, linear decay to zero), given this project's training shards,
               draft vocabulary, captured layers, TTT depth, epochs, learning rate and warmup, and the packing
               budget at which its sampler takes as many optimizer steps as this project's trainer does.
  ours         params.yaml's train section (train, export and evaluate stages, as draft_layouts.py runs them).
  ours+RECIPE  the same with one or more of RECIPES changed, e.g. ours+muon+uniform-steps.
The peer's draft is read into this project's draft (same layout, every tensor checked) and exported by the
project's own export code; its training tokens/s counts the real tokens of its epochs over its wall time.

Printed per arm, then the table per arm (mean over seeds, ± half their spread, ratio to the first arm): vLLM's
tokens per verifier step at k=3 greedy on the held-out prompts, each benchmark set and the long-context probe,
sampled at evaluate.temperature; the offline estimate and its top-1 agreement per draft position; training
tokens/s. Needs a project whose extract and vocab stages have run (default: this directory).

    python benchmarks/peer_trainer.py [--root .] [--arms peer ours ours+muon] [--seeds 0 1 2] [--json out.json]
                                      [--previous earlier.json ...]

--previous adds the results another run of this harness wrote with --json (other seeds of the same arms, on the
same project) to the table; an arm and seed measured twice is refused.
"""

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

import yaml
from scratch_project import K, evaluate, evaluate_at_k, link, measure, run_stage, summary
from speculators_peer import import_peer_draft, matching_budget, peer_python, train_data_ratio, write_peer_data

from eagle3.formats.exported_draft import write_drafts
from eagle3.formats.hf_config import read_config
from eagle3.formats.provenance import read_provenance
from eagle3.formats.shards import read_index
from eagle3.formats.vocab import load_vocab
from eagle3.paths import (
    BENCHMARKS_DIR,
    DRAFT_DIR,
    HIDDEN_DIR,
    PREPARED_DIR,
    SPECULATORS_DRAFT_DIR,
    SYNTHETIC_DIR,
    VERIFIER_DIR,
    VOCAB_DIR,
)

LINKED = (VERIFIER_DIR, PREPARED_DIR, BENCHMARKS_DIR, SYNTHETIC_DIR, HIDDEN_DIR, VOCAB_DIR)
# What each difference from the peer's recipe changes in train: (the recipe's name) -> train settings.
RECIPES = {
    "muon": {"optimizer": "muon"},
    "uniform-steps": {"step_weight": 1.0},
    "lr-to-zero": {"min_learning_rate": 0.0},
    "weight-decay": {"weight_decay": 0.01},
    "peer-layout": {"draft_layout": {"norm_before_fc": True, "norm_output": True, "norm_before_residual": True}},
    "frozen-head": {"freeze_lm_head": True},
    "beta2-0.999": {"adam_beta2": 0.999},
}


def _recipe(arm: str) -> dict:
    """train settings of an arm named ours[+RECIPE...]."""
    _, *names = arm.split("+")
    unknown = [name for name in names if name not in RECIPES]
    if unknown or not arm.startswith("ours"):
        raise SystemExit(f"--arms: {arm}: not peer, ours or ours+RECIPE with RECIPE one of {', '.join(RECIPES)}")
    return {key: value for name in names for key, value in RECIPES[name].items()}


def _work(root: Path, base: dict, name: str, seed: int, scratch: Path, train: dict) -> Path:
    work = scratch / f"{name}-seed{seed}"
    link(root, work, LINKED)
    params = json.loads(json.dumps(base))
    params["train"] = {**params["train"], **train, "seed": seed}
    params["evaluate"] = evaluate_at_k(params)
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    return work


def ours(root: Path, base: dict, arm: str, seed: int, scratch: Path) -> dict:
    work = _work(root, base, arm, seed, scratch, _recipe(arm))
    train_s = run_stage(work, "train")
    run_stage(work, "export")
    evaluate(work, scratch / "reference")
    return {"arm": arm, "seed": seed, **measure(work, train_s)}


class Peer:
    """The peer's interpreter, its copy of the training data and the packing budget that matches our steps."""

    def __init__(self, root: Path, base: dict, scratch: Path):
        self.root, self.python = root, peer_python(root)
        self.verifier = read_config(root / VERIFIER_DIR)
        self.vocab_size = read_provenance(root).vocab_size
        self.data = scratch / "peer-data"
        self.vocab = load_vocab(root, self.vocab_size)
        self.d2t_path, self.t2d_path, self.lengths = write_peer_data(root, self.data, *self.vocab)
        self.draft_vocab = len(self.vocab[0])
        self.layers = [int(i) for i in read_index(root)["layer_ids"][:-1]]
        train = base["train"]
        # This project's optimizer steps: batch_size sequences each (no max_tokens_per_batch in the params used).
        if train.get("max_tokens_per_batch"):
            raise SystemExit("peer arm: train.max_tokens_per_batch is set; the step match counts batch_size batches")
        self.steps_per_epoch = len(self.lengths) // train["batch_size"]
        self.budget = matching_budget(self.python, self.lengths, self.steps_per_epoch, seed=0)
        print(
            f"peer: speculators at --total-seq-len {self.budget} for {self.steps_per_epoch} steps an epoch "
            f"({len(self.lengths)} sequences)",
            flush=True,
        )

    def arm(self, base: dict, seed: int, scratch: Path) -> dict:
        train = base["train"]
        work = _work(self.root, base, "peer", seed, scratch, {})
        save = work / "peer-checkpoints"
        command = [
            self.python, "-m", "speculators.train", "--speculator-type", "eagle3",
            "--verifier-name-or-path", str(self.root / VERIFIER_DIR),
            "--data-path", str(self.data), "--hidden-states-path", str(self.data / "hidden_states"),
            "--d2t-path", str(self.d2t_path), "--t2d-path", str(self.t2d_path),
            "--draft-vocab-size", str(self.draft_vocab),
            "--target-layer-ids", *map(str, self.layers), "--num-layers", "1",
            "--ttt-steps", str(train["ttt_steps"]), "--epochs", str(train["epochs"]),
            "--lr", str(train["learning_rate"]), "--scheduler-warmup-steps", str(train["warmup_steps"]),
            "--total-seq-len", str(self.budget), "--seed", str(seed),
            "--train-data-ratio", str(train_data_ratio(len(self.lengths))),
            "--on-missing", "raise", "--save-path", str(save), "--log-dir", str(work / "peer-logs"),
            "--num-workers", "0", "--no-resume-from-checkpoint",
            "--draft-attn-impl", "sdpa", "--loss-implementation", "eager",
        ]  # fmt: skip
        started = time.monotonic()
        with (work / "peer-train.log").open("w") as log:
            result = subprocess.run(command, cwd=work, stdout=log, stderr=subprocess.STDOUT)
        train_s = time.monotonic() - started
        if result.returncode:
            raise SystemExit(f"speculators train failed (exit {result.returncode}): {work / 'peer-train.log'}")
        epochs = sorted((p for p in save.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
        draft = import_peer_draft(epochs[-1], self.verifier, tuple(self.layers))
        write_drafts(
            draft,
            *self.vocab,
            work / DRAFT_DIR,
            work / SPECULATORS_DRAFT_DIR,
            dtype=base["export"]["dtype"],
            num_speculative_tokens=K,
            verifier_name="verifier",
            verifier_architectures=self.verifier["architectures"],
        )
        evaluate(work, scratch / "reference")
        tokens_per_s = sum(self.lengths) * train["epochs"] / train_s
        return {"arm": "peer", "seed": seed, **measure(work, train_s, round(tokens_per_s, 1))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path("."))
    parser.add_argument("--arms", nargs="+", default=["peer", "ours"], help="peer, ours, ours+RECIPE[+RECIPE...]")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--previous", type=Path, nargs="+", default=[], help="--json files of earlier runs")
    args = parser.parse_args()
    previous = [row for path in args.previous for row in json.loads(path.read_text(encoding="utf-8"))]
    measured = {(row["arm"], row["seed"]) for row in previous}
    again = sorted(measured & {(arm, seed) for arm in args.arms for seed in args.seeds})
    if again or len(measured) < len(previous):
        raise SystemExit(f"--previous: {again or 'an arm and seed'} measured twice; drop it from --seeds or a file")
    for arm in args.arms:
        if arm != "peer":
            _recipe(arm)
    root = args.root.resolve()
    base = yaml.safe_load((root / "params.yaml").read_text(encoding="utf-8"))
    results = []
    with tempfile.TemporaryDirectory(prefix="eagle3-peer-") as directory:
        scratch = Path(directory)
        peer = Peer(root, base, scratch) if "peer" in args.arms else None
        for seed in args.seeds:
            for arm in args.arms:
                result = peer.arm(base, seed, scratch) if arm == "peer" else ours(root, base, arm, seed, scratch)
                results.append(result)
                print(json.dumps(result), flush=True)
                if args.json:
                    args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print("\n" + "\n".join(summary(previous + results)))


if __name__ == "__main__":
    main()
