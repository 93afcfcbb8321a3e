"""`eagle3 <command>`: one subcommand per DVC stage (names as in dvc.yaml), plus the tools around them.

A stage command runs eagle3/runner.py exactly as stages/<name>.py does for `dvc repro`. A tool is one row of TOOLS:
its help, the function that declares its options and the one that runs it, both named by module so that a module is
imported only for the command that runs (`eagle3 --help` and the tools start without torch); the parser and the
dispatch both read the table, so a tool cannot be declared and not run.
"""

import argparse
import importlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


@dataclass(frozen=True)
class Tool:
    help: str
    # "module:function" of add_arguments(parser) (None: no options) and of run(args, root) -> exit status | None.
    arguments: str | None
    run: str
    # Whether it reads the params file (and so takes --params after its name, as stages do).
    params: bool = True


TOOLS: dict[str, Tool] = {
    "check": Tool(
        "validate the params file and print it fully resolved (defaults filled in)", None, "eagle3.cli:check"
    ),
    "validate-draft": Tool(
        "check a draft directory against vLLM's EAGLE-3 or DFlash contract and its verifier",
        "eagle3.cli:validate_draft_arguments",
        "eagle3.cli:validate_draft",
        params=False,
    ),
    "plan": Tool(
        "hero-run disk, time and cost: extract here and ship, or extract there",
        "eagle3.plan.flags:add_arguments",
        "eagle3.plan.render:main",
    ),
    "init": Tool(
        "write a shipped configuration (e.g. kimi-k2.5, the hero run), or one sized for any verifier "
        "(--verifier DIR), as the params file",
        "eagle3.init.shipped:add_arguments",
        "eagle3.init.shipped:main",
    ),
    "preflight": Tool(
        "measure this machine before a run: training, extraction, serving, disk",
        "eagle3.preflight.run:add_arguments",
        "eagle3.preflight.run:main",
    ),
    "repair": Tool(
        "check an output's copies (workspace, DVC cache, remote) against dvc.lock; restore bad ones",
        "eagle3.remotes.repair:add_arguments",
        "eagle3.remotes.repair:main",
    ),
    "server": Tool(
        "start a model server (`vllm serve`) in the background and wait until it answers, or stop it",
        "eagle3.servers:add_arguments",
        "eagle3.servers:main",
    ),
}


def resolve(target: str) -> Any:
    """The function a TOOLS entry names as "module:function"."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


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
    for name, tool in TOOLS.items():
        # A subcommand whose --help opens with the line `eagle3 --help` shows for it.
        description = tool.help[0].upper() + tool.help[1:] + "."
        command = commands.add_parser(
            name, help=tool.help, description=description, parents=[params] if tool.params else []
        )
        if tool.arguments is not None:
            resolve(tool.arguments)(command)
    return parser


def validate_draft_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("draft", type=Path, help="draft directory (config.json + model.safetensors)")
    parser.add_argument("--verifier", type=Path, required=True, help="the verifier's HF directory")


def validate_draft(args: argparse.Namespace, root: Path) -> None:
    from eagle3.formats.exported_dflash import is_dflash, validate_dflash
    from eagle3.formats.exported_draft import validate_draft as validate

    if is_dflash(args.draft):
        validate_dflash(args.draft, args.verifier)
        print(f"{args.draft}: valid DFlash draft for {args.verifier}")
        return
    validate(args.draft, args.verifier)
    print(f"{args.draft}: valid EAGLE-3 draft for {args.verifier}")


def check(args: argparse.Namespace, root: Path) -> None:
    from eagle3.params.params_file import check_against_verifier, check_license_gate, load_params
    from eagle3.plan.gpu_fit import check_evaluate_memory, check_gpu_memory

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


def main(argv: list[str] | None = None) -> int:
    from eagle3.runner import report_missing_modules_in_one_line

    report_missing_modules_in_one_line()
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
        return resolve(TOOLS[args.command].run)(args, root) or 0
    except Eagle3Error as exc:
        print(f"eagle3 {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
