"""`eagle3 init NAME --layout A|B|C`: switch a checkout to a shipped configuration.

The shipped configurations are eagle3/configs/NAME.yaml, complete params files with a reason beside each choice
(kimi-k2.5: the hero run). The layouts are `eagle3 plan`'s: A extracts the hidden states here and ships them, B
ships the text and extracts on the rented machine, C ships the text and streams the states there. A and B train on
stored states with the same params; C is the file with LAYOUT_KEYS["C"] set. The file is rewritten with its
comments kept (ruamel.yaml's round trip) and validated before anything is written; an uncommitted params.yaml is
never overwritten without --force (git keeps the committed one).
"""

import argparse
import io
import subprocess
from pathlib import Path
from typing import Any

from eagle3.errors import Eagle3Error
from eagle3.files import write_text

CONFIGS_DIR = Path(__file__).resolve().parents[1] / "configs"
LAYOUTS = ("A", "B", "C")
# What each layout sets over the shipped file, as (section, key) -> value.
LAYOUT_KEYS: dict[str, dict[tuple[str, str], Any]] = {
    "A": {},
    "B": {},
    "C": {("train", "hidden_states"): "streamed", ("extract", "splits"): ["heldout"]},
}


def shipped() -> list[str]:
    return sorted(path.stem for path in CONFIGS_DIR.glob("*.yaml"))


def _yaml():
    from ruamel.yaml import YAML

    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 120
    yaml.indent(mapping=2, sequence=4, offset=2)
    yaml.representer.add_representer(
        type(None), lambda representer, _: representer.represent_scalar("tag:yaml.org,2002:null", "null")
    )
    return yaml


def render(name: str, layout: str) -> str:
    """The text of configuration `name` for `layout`, comments kept."""
    if name not in shipped():
        raise Eagle3Error(f"no shipped configuration {name!r}; one of {', '.join(shipped())}")
    if layout not in LAYOUTS:
        raise Eagle3Error(f"--layout: one of {', '.join(LAYOUTS)}, got {layout!r}")
    yaml = _yaml()
    document = yaml.load((CONFIGS_DIR / f"{name}.yaml").read_text(encoding="utf-8"))
    for (section, key), value in LAYOUT_KEYS[layout].items():
        if isinstance(value, list):  # in place: the list keeps its style and its comment
            document[section][key].clear()
            document[section][key].extend(value)
        else:
            document[section][key] = value
    out = io.StringIO()
    yaml.dump(document, out)
    return out.getvalue()


def _uncommitted(path: Path) -> bool:
    """Whether `path` holds changes git does not have (or git cannot say: then assume it does)."""
    if not path.exists():
        return False
    result = subprocess.run(
        ["git", "status", "--porcelain", "--", path.name], cwd=path.parent, capture_output=True, text=True
    )
    return result.returncode != 0 or bool(result.stdout.strip())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="a shipped configuration: " + ", ".join(shipped()))
    parser.add_argument("--layout", required=True, choices=LAYOUTS, help="A, B or C, as `eagle3 plan` names them")
    parser.add_argument("--force", action="store_true", help="overwrite a params file git does not have")


def main(args: argparse.Namespace) -> None:
    import yaml

    from eagle3.config import Params
    from eagle3.params.loading import validate

    target: Path = args.params
    text = render(args.name, args.layout)
    validate(yaml.safe_load(text), Params, CONFIGS_DIR / f"{args.name}.yaml")
    if _uncommitted(target) and not args.force:
        raise Eagle3Error(
            f"{target} has changes git does not have; commit or stash them, or pass --force to overwrite it"
        )
    write_text(target, text)
    print(f"{target}: the {args.name} configuration, layout {args.layout} (`git diff {target.name}` shows the change)")
