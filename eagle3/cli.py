"""`eagle3 <command>`: one subcommand per DVC stage (names as in dvc.yaml), plus the tools around them.

A stage command runs eagle3/runner.py exactly as stages/<name>.py does for `dvc repro`. Stage modules are
imported only for the command that runs, so `eagle3 --help` and the tools start without torch.
"""

import argparse
import importlib
import json
import sys
from pathlib import Path

from eagle3.errors import Eagle3Error
from eagle3.secret_filter import guard_output

# Stage name (= module in eagle3/stages/ = dvc.yaml stage) -> one-line help.
STAGES: dict[str, str] = {
    "verifier": "fetch/convert the verifier and record its provenance",
    "prepare": "normalise, dedupe and split the open prompt datasets",
    "benchmarks": "fetch the pinned benchmark prompt sets (MT-bench, HumanEval, ...), drop training overlaps",
    "generate": "the verifier regenerates every assistant turn (resumable)",
    "extract": "verifier hidden states -> compressed, checksummed shards (resumable)",
    "vocab": "draft vocabulary (d2t/t2d) from the answers' token frequencies",
    "train": "train the EAGLE-3 draft with training-time test (resumable; torchrun for DDP)",
    "export": "write the draft in vLLM's EAGLE-3 format and the speculators format",
    "evaluate": "tokens per verifier step inside vLLM on held-out and benchmark prompts, vs vLLM's ngram",
    "report": "license gate, lineage record and model card; --check verifies them",
}


def _command(commands, name: str, help_text: str, **kwargs) -> argparse.ArgumentParser:
    """A subcommand whose --help opens with the line `eagle3 --help` shows for it."""
    return commands.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".", **kwargs)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("eagle3")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed: run make setup)"


def build_parser() -> argparse.ArgumentParser:
    from eagle3.runner import PARAMS_HELP

    parser = argparse.ArgumentParser(
        prog="eagle3",
        description="Reproducible EAGLE-3 draft training for vLLM. Every command reads the params file; its directory "
        "is the project root. Paths given on the command line are relative to the current directory.",
    )
    parser.add_argument("--version", action="version", version=f"eagle3 {_version()}")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"), help=PARAMS_HELP)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_text in STAGES.items():
        # The stage's own options (and its --help) are parsed by the stage's parser once it is imported.
        commands.add_parser(name, help=f"stage: {help_text}", add_help=False)
    # Tools take --params after their name too, as stages do.
    params = argparse.ArgumentParser(add_help=False)
    params.add_argument("--params", type=Path, default=argparse.SUPPRESS, help=PARAMS_HELP)
    _command(
        commands, "check", "validate the params file and print it fully resolved (defaults filled in)", parents=[params]
    )
    validate = _command(
        commands, "validate-draft", "check a draft directory against vLLM's EAGLE-3 contract and its verifier"
    )
    validate.add_argument("draft", type=Path, help="draft directory (config.json + model.safetensors)")
    validate.add_argument("--verifier", type=Path, required=True, help="the verifier's HF directory")
    from eagle3.tools import plan_flags

    plan_flags.add_arguments(
        _command(
            commands,
            "plan",
            "hero-run disk, time and cost: extract here and ship, or extract there",
            parents=[params],
        )
    )
    from eagle3.tools import configs

    configs.add_arguments(
        _command(
            commands,
            "init",
            "write a shipped configuration (e.g. kimi-k2.5, the hero run), or one sized for any verifier "
            "(--verifier DIR), as the params file",
            parents=[params],
        )
    )
    from eagle3.tools import preflight

    preflight.add_arguments(
        _command(
            commands,
            "preflight",
            "measure this machine before a run: training, extraction, serving, disk",
            parents=[params],
        )
    )
    from eagle3.tools import repair

    repair.add_arguments(
        _command(
            commands,
            "repair",
            "check an output's copies (workspace, DVC cache, remote) against dvc.lock; restore bad ones",
            parents=[params],
        )
    )
    from eagle3.tools import server

    server.add_arguments(
        _command(
            commands,
            "server",
            "start a model server (`vllm serve`) in the background and wait until it answers, or stop it",
            parents=[params],
        )
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    guard_output()
    args, rest = build_parser().parse_known_args(argv)
    if args.command in STAGES:
        from eagle3.runner import execute, stage_parser

        stage = importlib.import_module(f"eagle3.stages.{args.command}")
        options = stage_parser(stage, f"eagle3 {args.command}", args.params).parse_args(rest)
        return execute(stage, args.command, options.params, options)
    if rest:
        build_parser().error(f"unrecognized arguments: {' '.join(rest)}")
    root = args.params.resolve().parent
    try:
        if args.command == "validate-draft":
            from eagle3.formats.exported_draft import validate_draft

            validate_draft(args.draft, args.verifier)
            print(f"{args.draft}: valid EAGLE-3 draft for {args.verifier}")
        elif args.command == "plan":  # not a stage: flags, the params file and the measured metrics
            from eagle3.tools import plan_cli

            plan_cli.main(args, root)
        elif args.command == "init":
            from eagle3.tools import configs

            configs.main(args)
        elif args.command == "preflight":  # not a stage: measures the machine, writes no pipeline output
            from eagle3.tools import preflight

            return preflight.main(args, root)
        elif args.command == "repair":  # not a stage: DVC's copies of what the stages made
            from eagle3.tools import repair

            return repair.main(args, root)
        elif args.command == "server":  # not a stage: the servers generate and evaluate talk to
            from eagle3.tools import server

            return server.main(args, root)
        else:
            from eagle3.config import check_against_verifier, check_license_gate, load_params
            from eagle3.tools.plan_memory import check_evaluate_memory, check_gpu_memory

            params = load_params(args.params)
            notes = check_against_verifier(params, args.params)
            notes += check_gpu_memory(params, args.params)
            notes += check_evaluate_memory(params, args.params)
            notes.append(check_license_gate(params, args.params))
            for warning in params.warnings():
                print(f"eagle3 check: warning: {args.params.name}: {warning}", file=sys.stderr)
            for note in notes:
                print(f"eagle3 check: {note}", file=sys.stderr)
            print(json.dumps(params.model_dump(mode="json"), indent=2))
    except Eagle3Error as exc:
        print(f"eagle3 {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
