"""Draft quality against training budget, on the project's own shards: what more training buys.

Each configuration (overrides of params.yaml's `vocab` and `train` sections) builds the draft vocabulary and
trains a draft from scratch with the real stages (eagle3/stages/{vocab,train,export}.py) in a scratch project
that links this one's verifier and hidden states, then measures the exported draft's offline tokens per
verifier step at k=3 over the held-out hidden states (eagle3/engines/offline_estimate.py: offline_estimate; the
evaluate stage writes the vLLM figure beside it, with the gap). Configurations run one after another in this
process, so their wall times are comparable; the printed ratios are against the first configuration.

    python benchmarks/train_budget.py [--root .] --config train.epochs=2 \
        --config train.epochs=2,train.batch_size=4 --config vocab.draft_vocab_size=4096,train.epochs=2
"""

import argparse
import tempfile
import time
from pathlib import Path

import yaml

from eagle3.engines.offline_estimate import offline_estimate
from eagle3.params.params_file import load_params
from eagle3.paths import HIDDEN_DIR, VERIFIER_DIR
from eagle3.stages import export, train, vocab

SECTIONS = ("vocab", "train")


def overrides(text: str) -> dict[str, dict]:
    """'train.epochs=2,vocab.draft_vocab_size=4096' -> {'train': {'epochs': 2}, 'vocab': {...}} (YAML scalars)."""
    result: dict[str, dict] = {section: {} for section in SECTIONS}
    for item in filter(None, text.split(",")):
        key, equals, value = item.partition("=")
        section, dot, name = key.strip().partition(".")
        if not (equals and dot and section in SECTIONS and name):
            raise SystemExit(f"--config {text!r}: expected section.key=value[,...] with section one of {SECTIONS}")
        result[section][name] = yaml.safe_load(value)
    return result


def describe(config: dict[str, dict]) -> str:
    return ",".join(f"{section}.{key}={value}" for section, values in config.items() for key, value in values.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path("."))
    parser.add_argument(
        "--config",
        action="append",
        required=True,
        type=overrides,
        help="overrides, e.g. train.epochs=2,vocab.draft_vocab_size=4096 (repeat per configuration)",
    )
    args = parser.parse_args()
    root = args.root.resolve()
    base = yaml.safe_load((root / "params.yaml").read_text(encoding="utf-8"))
    rows = []
    for config in args.config:
        with tempfile.TemporaryDirectory(prefix="eagle3-budget-") as scratch:
            work = Path(scratch)
            for linked in (VERIFIER_DIR, HIDDEN_DIR):
                (work / linked).parent.mkdir(parents=True, exist_ok=True)
                (work / linked).symlink_to(root / linked)
            params_file = work / "params.yaml"
            merged = {**base, **{section: {**base[section], **config[section]} for section in SECTIONS}}
            params_file.write_text(yaml.safe_dump(merged), encoding="utf-8")
            params = load_params(params_file)
            vocab.run(params, work)
            started = time.monotonic()
            train.run(params, work)
            seconds = time.monotonic() - started
            export.run(params, work)
            estimate = offline_estimate(work, 3, params.evaluate.offline)
            rows.append((config, seconds, estimate))
            print(
                f"{describe(config)}: {seconds:.0f} s, offline tokens/step {estimate['tokens_per_step']}, "
                f"top-1 agreement {estimate['top1_agreement_by_position']}",
                flush=True,
            )
    first_seconds, first = rows[0][1], rows[0][2]["tokens_per_step"]
    print("\nconfiguration | train s | time ratio | offline tokens/step (k=3) | vs first")
    for config, seconds, estimate in rows:
        print(
            f"{describe(config)} | {seconds:.0f} | {seconds / first_seconds:.2f}x | {estimate['tokens_per_step']} | "
            f"{estimate['tokens_per_step'] - first:+.3f}"
        )


if __name__ == "__main__":
    main()
