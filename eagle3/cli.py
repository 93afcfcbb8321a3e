"""`eagle3 <command>`: one subcommand per DVC stage, plus tools around them.

stages/<stage>.py calls this same entry point, so `dvc repro` and a user at the
shell run identical code.
"""

import argparse
import importlib
import json
import sys
from pathlib import Path

from eagle3.config import load_params
from eagle3.errors import Eagle3Error

# name -> (module, one-line help). Each module exposes run(params, root, options).
STAGES: dict[str, tuple[str, str]] = {
    "verifier": ("eagle3.verifier", "fetch/convert the verifier and record its provenance"),
    "prepare": ("eagle3.prepare", "normalise, dedupe and split the open prompt datasets"),
    "generate": ("eagle3.generate", "the verifier regenerates every assistant turn (resumable)"),
    "extract": ("eagle3.extract", "verifier hidden states -> compressed, checksummed shards (resumable)"),
    "vocab": ("eagle3.vocab", "draft vocabulary (d2t/t2d) from the answers' token frequencies"),
    "train": ("eagle3.train", "train the EAGLE-3 draft with training-time test (resumable; torchrun for DDP)"),
    "export": ("eagle3.export", "write the draft in vLLM's EAGLE-3 format and the speculators format"),
    "evaluate": ("eagle3.evaluate", "tokens per verifier step inside vLLM on held-out prompts, vs vLLM's ngram"),
    "lineage": ("eagle3.lineage", "(stage report) license gate, lineage record and model card; --check verifies them"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eagle3", description="Reproducible EAGLE-3 draft training for vLLM.")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"), help="params file (default: params.yaml)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, help_text) in STAGES.items():
        stage = commands.add_parser(name, help=f"stage: {help_text}")
        if name == "generate":
            stage.add_argument("--rank", type=int, default=0, help="this process's slice of the parts (default 0)")
            stage.add_argument("--world-size", type=int, default=1, help="number of slices run in parallel (default 1)")
        if name == "lineage":
            stage.add_argument("--check", action="store_true", help="verify the workspace against dvc.lock and reports/lineage.json; write nothing")
    commands.add_parser("check", help="validate the params file and print it fully resolved (defaults filled in)")
    validate = commands.add_parser("validate-draft", help="check a draft directory against vLLM's EAGLE-3 contract and its verifier")
    validate.add_argument("draft", type=Path, help="draft directory (config.json + model.safetensors)")
    validate.add_argument("--verifier", type=Path, required=True, help="the verifier's HF directory")
    from eagle3 import plan

    plan.add_arguments(commands.add_parser("plan", help="hero-run disk, time and cost: extract here and ship, extract there, or online"))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "validate-draft":
            from eagle3.validate import validate_draft

            validate_draft(args.draft, args.verifier)
            print(f"{args.draft}: valid EAGLE-3 draft for {args.verifier}")
            return 0
        if args.command == "plan":  # not a stage: CLI flags and measured metrics, no params.yaml
            from eagle3.plan import main as plan

            plan(args)
            return 0
        params = load_params(args.params)
        root = args.params.resolve().parent
        if args.command == "check":
            print(json.dumps(params.model_dump(mode="json"), indent=2))
        else:
            module = importlib.import_module(STAGES[args.command][0])
            module.run(params, root, args)
    except Eagle3Error as exc:
        print(f"eagle3 {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"eagle3 {args.command}: interrupted; finished work is kept, rerun to continue", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
