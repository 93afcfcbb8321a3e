"""`eagle3 init NAME --layout A|B|C [--gpu KIND] [--draft-repo ORG/NAME]`: switch a checkout to a shipped
configuration.

The shipped configurations are eagle3/configs/NAME.yaml, complete params files with a reason beside each choice
(kimi-k2.5: the hero run; the one-machine recipes for other verifiers, `--layout single`, are
eagle3/init/recipes.py's). The layouts are `eagle3 plan`'s: A extracts the hidden states here and ships them, B
ships the text and extracts on the rented machine, C ships the text and streams the states there. A and B train on
stored states with the same params; C is the file with LAYOUT_KEYS["C"] set, and the verifier's share of each GPU
beside the trainers sized for --gpu (side by side where both fit, else in phases: eagle3/plan/gpu_fit.py).
--gpu also records the rented GPU kind (train.launch.gpu), which `eagle3 check` and `eagle3 plan` hold the run to;
--draft-repo the Hub repository the model card names. Each key set gets its reason as a comment. The file is
rewritten with its comments kept (ruamel.yaml's round trip) and validated before anything is written; an
uncommitted params.yaml is never overwritten without --force (git keeps the committed one).
"""

import argparse
import io
import subprocess
from pathlib import Path
from typing import Any

from eagle3.errors import Eagle3Error
from eagle3.files import write_text
from eagle3.gpu_kinds import GPUS
from eagle3.init.files import CONFIGS_DIR, recipes, shipped, shipped_names, yaml_round_trip

LAYOUTS = ("A", "B", "C")
# What each layout sets over the shipped file, as (section, key) -> value.
LAYOUT_KEYS: dict[str, dict[tuple[str, str], Any]] = {
    "A": {},
    "B": {},
    "C": {("train", "hidden_states"): "streamed", ("extract", "splits"): ["heldout"]},
}


def render(name: str, layout: str, gpu: str | None = None, draft_repo: str | None = None) -> str:
    """The text of configuration `name` for `layout` (and the rented GPU kind, and the Hub repository), comments
    kept."""
    if name not in shipped():
        raise Eagle3Error(f"no shipped configuration {name!r}; one of {shipped_names()}")
    if layout not in LAYOUTS:
        raise Eagle3Error(f"--layout: one of {', '.join(LAYOUTS)}, got {layout!r}")
    yaml = yaml_round_trip()
    document = yaml.load((CONFIGS_DIR / f"{name}.yaml").read_text(encoding="utf-8"))
    for (section, key), value in LAYOUT_KEYS[layout].items():
        if isinstance(value, list):  # in place: the list keeps its style and its comment
            document[section][key].clear()
            document[section][key].extend(value)
        else:
            document[section][key] = value
    if gpu is not None:
        _refuse_unloadable(document, gpu)
        _set(document["train"]["launch"], "gpu", gpu, f"eagle3 init --gpu: the rented machine's {GPUS[gpu].name}s")
        if layout == "C":
            _size_streaming(document, gpu)
    elif layout == "C":
        raise Eagle3Error(
            "--layout C: give --gpu (one of " + ", ".join(GPUS) + "): the verifier's share of each GPU beside the "
            "trainers depends on it"
        )
    if draft_repo is not None:
        _set(document["report"], "draft_repo", draft_repo, "eagle3 init --draft-repo: the card's serve command")
    out = io.StringIO()
    yaml.dump(document, out)
    return out.getvalue()


def _set(mapping, key: str, value: Any, reason: str, after: str | None = None) -> None:
    """`key: value  # reason`, in place where the key is, else after `after` (else at the end)."""
    if key not in mapping and after is not None:
        mapping.insert(list(mapping).index(after) + 1, key, value)
    else:
        mapping[key] = value
    mapping.yaml_add_eol_comment(reason, key)


def _refuse_unloadable(document, gpu: str) -> None:
    """Every layout serves the verifier on the rented machine: refuse a GPU kind whose machine cannot load it."""
    from eagle3.plan.gpu_fit import verifier_fit_problem

    name = document["verifier"]["source"]["name"]
    preset = _preset(name)
    if preset is None or preset.weights_bytes is None:
        return
    gpus = document["extract"]["vllm"]["tensor_parallel_size"]
    problem = verifier_fit_problem(name, preset.weights_bytes, gpus, gpu)
    if problem is not None:
        raise Eagle3Error(f"--gpu {gpu}: {problem} (--gpu KIND)")


def _preset(name: str):
    from eagle3.plan.facts import PRESETS

    return next((shape for shape in PRESETS.values() if shape.name == name), None)


def _size_streaming(document, gpu: str) -> None:
    """Layout C on `gpu`: the verifier's share of each GPU, and phases where it and the trainer do not fit at once."""
    from eagle3.params.train import TrainParams, draft_settings
    from eagle3.plan.facts import Machine
    from eagle3.plan.gpu_fit import streamed_fit, verifier_share
    from eagle3.plan.memory import compute_train_memory, estimate
    from eagle3.training.data import tokens_per_process

    name = document["verifier"]["source"]["name"]
    preset = _preset(name)
    if preset is None or preset.weights_bytes is None:
        raise Eagle3Error(
            f"--layout C: the size of {name} is not known here; set extract.vllm.gpu_memory_utilization and "
            "train.stream_phase_steps yourself (docs/pipeline.md, streamed hidden states)"
        )
    train = TrainParams.model_validate(_plain(document["train"]))
    extract = document["extract"]
    processes = extract["vllm"]["tensor_parallel_size"]
    vocab = document["vocab"]["draft_vocab_size"]
    lines = estimate(preset.config, vocab, train.ttt_steps, processes, train.sharding, draft_settings(train))
    tokens = tokens_per_process(train.max_tokens_per_batch, train.batch_size, processes, extract["max_seq_len"])
    memory = compute_train_memory(lines, tokens, Machine(gpu, processes, 0.0, 0.0, None))
    captured = len(extract["aux_layer_ids"] or [None] * 3) + 1
    share = verifier_share(preset.weights_bytes, processes, gpu, preset.config, captured, extract["max_seq_len"] + 1)
    fit = streamed_fit(memory, train.activation_checkpointing, share, phases=False)
    if fit is not None and not fit.fits:
        fit = streamed_fit(memory, train.activation_checkpointing, share, phases=True)
    if fit is None or not fit.fits:
        raise Eagle3Error(
            f"--layout C --gpu {gpu}: {name} and the trainer do not fit one {GPUS[gpu].name} even in phases "
            f"({fit.words() if fit else memory.source}); use layout B, or a GPU with more memory"
        )
    _set(extract["vllm"], "gpu_memory_utilization", share, f"layout C on {gpu}, {fit.summary()}")
    if fit.phases:
        step_bytes = (
            (train.max_tokens_per_batch or train.batch_size * extract["max_seq_len"])
            * captured
            * (preset.hidden_size * 2)
        )
        steps = int(train.stream_buffer_gb * 1e9 // step_bytes)
        if steps < 1:
            raise Eagle3Error(
                f"--layout C --gpu {gpu}: the trainer and the verifier take turns (phases), but train.stream_buffer_gb "
                f"({train.stream_buffer_gb:g}) holds less than one step's states ({step_bytes / 1e9:.1f} GB); raise it"
            )
        _set(
            document["train"],
            "stream_phase_steps",
            steps,
            f"layout C on {gpu}: the steps stream_buffer_gb holds ({step_bytes / 1e9:.1f} GB each)",
            after="stream_buffer_gb",
        )


def _plain(node: Any) -> Any:
    """ruamel's round-trip containers as plain dicts and lists."""
    if isinstance(node, dict):
        return {key: _plain(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_plain(value) for value in node]
    return node


def _uncommitted(path: Path) -> bool:
    """Whether `path` holds changes git does not have (or git cannot say: then assume it does)."""
    if not path.exists():
        return False
    result = subprocess.run(
        ["git", "status", "--porcelain", "--", path.name], cwd=path.parent, capture_output=True, text=True
    )
    return result.returncode != 0 or bool(result.stdout.strip())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from eagle3.init import from_verifier as init_verifier

    parser.add_argument("name", nargs="?", help="a shipped configuration: " + shipped_names())
    parser.add_argument(
        "--layout",
        required=True,
        choices=(*LAYOUTS, "single"),
        help="A, B or C, as `eagle3 plan` names them; single (with --verifier or a recipe): every stage on one GPU "
        "machine",
    )
    parser.add_argument(
        "--gpu",
        choices=list(GPUS),
        help="the GPU kind (train.launch.gpu): check and plan hold the run to it; layout C and --verifier need it",
    )
    parser.add_argument(
        "--draft-repo", metavar="ORG/NAME", help="the Hub repository the draft is published as (report.draft_repo)"
    )
    parser.add_argument("--force", action="store_true", help="overwrite a params file git does not have")
    init_verifier.add_arguments(parser)


def _text(args: argparse.Namespace) -> tuple[str, str, str]:
    """The params text, what it was made from (for errors and the summary) and the file validation names."""
    from eagle3.init import from_verifier as init_verifier
    from eagle3.init.recipes import render_recipe
    from eagle3.init.verifier_files import read_verifier

    if (args.name is None) == (args.verifier is None):
        raise Eagle3Error(f"give a shipped configuration ({shipped_names()}) or --verifier DIR, not both")
    if args.name is not None and args.name not in (*shipped(), *recipes()):
        raise Eagle3Error(f"no shipped configuration {args.name!r}; one of {shipped_names()}")
    if args.gpus is not None and args.gpus < 1:
        raise Eagle3Error(f"--gpus: at least 1, got {args.gpus}")
    # What only sizing from a model's files reads; a recipe takes --thinking and --license-override over its own.
    files_only = {
        "--name": args.name_override,
        "--license": args.license_id,
        "--trust-remote-code": args.trust_remote_code or None,
    }
    sizing = {"--gpus": args.gpus, "--thinking": args.thinking, "--license-override": args.license_override}
    hero = args.name in shipped()
    unused = [flag for flag, value in files_only.items() if value is not None and args.verifier is None]
    unused += [flag for flag, value in sizing.items() if value is not None and hero]
    if unused:
        raise Eagle3Error(
            f"{unused[0]}: not for {args.name}, "
            + (
                "a hero-run configuration; with --verifier DIR or a one-machine recipe"
                if hero
                else "whose recipe names it"
            )
        )
    if args.name in recipes():
        if args.layout != "single":
            raise Eagle3Error(f"--layout {args.layout}: {args.name} is a one-machine recipe; --layout single")
        thinking = None if args.thinking is None else args.thinking == "on"
        text = render_recipe(args.name, args.gpu, args.gpus, thinking, args.license_override)
        return (
            _with_draft_repo(text, args.draft_repo),
            f"the {args.name} recipe, layout single",
            str(CONFIGS_DIR / f"{args.name}.yaml"),
        )
    if args.verifier is None:
        if args.layout == "single":
            raise Eagle3Error(f"--layout single: with --verifier DIR; {args.name} is shipped for A, B or C")
        text = render(args.name, args.layout, args.gpu, args.draft_repo)
        return text, f"the {args.name} configuration, layout {args.layout}", str(CONFIGS_DIR / f"{args.name}.yaml")
    if args.layout != "single":
        raise Eagle3Error("--verifier: --layout single (every stage on one GPU machine) is what it sizes")
    if args.gpu is None:
        raise Eagle3Error("--verifier: give --gpu (one of " + ", ".join(GPUS) + "): the sizes follow its memory")
    verifier = read_verifier(args.verifier, args.name_override, args.license_id)
    thinking = None if args.thinking is None else args.thinking == "on"
    text = init_verifier.params_for(
        verifier, args.gpu, args.gpus or 1, thinking, args.trust_remote_code, args.license_override
    )
    return (
        _with_draft_repo(text, args.draft_repo),
        f"sized for {verifier.name}, layout single",
        "eagle3 init --verifier",
    )


def _with_draft_repo(text: str, draft_repo: str | None) -> str:
    if draft_repo is None:
        return text
    yaml = yaml_round_trip()
    document = yaml.load(text)
    _set(document["report"], "draft_repo", draft_repo, "eagle3 init --draft-repo: the card's serve command")
    out = io.StringIO()
    yaml.dump(document, out)
    return out.getvalue()


def main(args: argparse.Namespace, root: Path) -> None:
    import yaml

    from eagle3.params.loading import validate
    from eagle3.params.params_file import Params

    target: Path = args.params
    text, made, source = _text(args)
    validate(yaml.safe_load(text), Params, Path(source))
    if _uncommitted(target) and not args.force:
        raise Eagle3Error(
            f"{target} has changes git does not have; commit or stash them, or pass --force to overwrite it"
        )
    write_text(target, text)
    on = f", on {GPUS[args.gpu].name}s" if args.gpu else ""
    print(f"{target}: {made}{on} (`git diff {target.name}` shows the change)")
