"""Run one stage: read the params sections it declares, run it, and turn failures into one line and an exit code.

stages/<name>.py (what `dvc repro` runs) and `eagle3 <stage>` both end here, so DVC and a user at the shell
run identical code. A stage module (eagle3/stages/) defines `Params` (a StageParams with one field per
params.yaml section it reads), `run(params, root, options)` and optionally `add_arguments(parser)` and
`USES_GPUS` (true: refused where nvidia-smi lists GPUs that torch cannot see).
"""

import argparse
import importlib
import os
import sys
from pathlib import Path
from types import ModuleType

from eagle3.errors import Eagle3Error
from eagle3.files import disk_full_message, is_disk_full
from eagle3.locked_environment import environment_warning, unseen_gpus
from eagle3.params.loading import read_yaml, use_params_file, validate
from eagle3.secret_filter import guard_output


def report_missing_modules_in_one_line() -> None:
    """From now on, a module the environment lacks (a package removed from the venv, a broken install) is one line
    saying what to run, wherever it is imported. The entry points (stages/<name>.py, `eagle3`) call it before they
    import any stage."""
    previous = sys.excepthook

    def one_line(kind, value, traceback) -> None:
        if issubclass(kind, ModuleNotFoundError):
            print(
                f"eagle3: error: module {value.name!r} is not installed in this environment ({sys.prefix}); run "
                "`make setup`, which re-syncs the venv to the lock",
                file=sys.stderr,
            )
            return
        previous(kind, value, traceback)

    sys.excepthook = one_line


# Validates the whole params file before any stage starts (see eagle3/params/params_file.py); imported by name because
# no stage output depends on it, so it is not among any stage's DVC deps.
_WHOLE_FILE = "eagle3.params.params_file"


def load_stage_params(stage: ModuleType, path: Path, command: str):
    use_params_file(path)
    raw = read_yaml(path)
    whole_file = importlib.import_module(_WHOLE_FILE)
    everything = validate(raw, whole_file.Params, path)
    whole_file.check_against_verifier(everything, path)
    if "WORLD_SIZE" not in os.environ:  # once per stage, not once per training process
        for warning in everything.warnings():
            print(f"eagle3 {command}: warning: {path.name}: {warning}", file=sys.stderr)
    return validate(raw, stage.Params, path)


def execute(stage: ModuleType, command: str, params_path: Path, options: argparse.Namespace | None) -> int:
    """Run `stage` with the params at `params_path`; the exit code (0, or what the error says)."""
    # Processes torchrun started (eagle3/training/launch.py) run in the environment the stage that started them
    # has already checked.
    warning = None if "WORLD_SIZE" in os.environ else environment_warning()
    if warning:
        print(warning, file=sys.stderr)
    unseen = unseen_gpus() if getattr(stage, "USES_GPUS", False) else None
    if unseen:
        print(f"eagle3 {command}: error: {unseen}", file=sys.stderr)
        return Eagle3Error.exit_code
    try:
        params = load_stage_params(stage, params_path, command)
        options = options if options is not None else argparse.Namespace()
        options.params_file = params_path.resolve()  # a stage that starts processes passes it on
        stage.run(params, params_path.resolve().parent, options)
    except Eagle3Error as exc:
        print(f"eagle3 {command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"eagle3 {command}: interrupted; finished work is kept, rerun to continue", file=sys.stderr)
        return 130
    except Exception as exc:
        # A full disk where no writer of this project named the file (a library writing on its own).
        if not is_disk_full(exc):
            raise
        where = Path(getattr(exc, "filename", None) or params_path.resolve().parent)
        print(f"eagle3 {command}: error: {disk_full_message(where)}", file=sys.stderr)
        return Eagle3Error.exit_code
    return 0


PARAMS_HELP = "params file; its directory is the project root (default: ./params.yaml)"


def stage_parser(stage: ModuleType, prog: str, default_params: Path | None) -> argparse.ArgumentParser:
    """A stage's command line, the same for `python stages/<name>.py` and `eagle3 <name>`: --params and the
    stage's own options, described by the first line of the stage module's docstring."""
    parser = argparse.ArgumentParser(prog=prog, description=(stage.__doc__ or "").split("\n")[0])
    parser.add_argument("--params", type=Path, default=default_params, help=PARAMS_HELP)
    if hasattr(stage, "add_arguments"):
        stage.add_arguments(parser)
    return parser


def main(stage: ModuleType, argv: list[str] | None = None) -> int:
    """Entry point of stages/<name>.py: `python stages/<name>.py [--params FILE] [stage options]`."""
    guard_output()
    command = stage.__name__.rsplit(".", 1)[-1]
    options = stage_parser(stage, f"stages/{command}.py", Path("params.yaml")).parse_args(argv)
    return execute(stage, command, options.params, options)
