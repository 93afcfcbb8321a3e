"""What the project's configuration decides for `eagle3 plan`: every flag it answers (TTT steps, draft vocabulary,
epochs, the longest sample, storage, layers captured, checkpoints kept, the stream buffer, sharding, recompute,
processes, the optimizer and the batches) comes from the params file unless the flag is given, and each input's
source is named beside it ("params.yaml train.ttt_steps"). Without a params file the shipped hero configuration
(eagle3/configs/kimi-k2.5.yaml) answers them, named as such, but for what a run is asked for (how many samples, how
long, stored how) and what that configuration leaves to the rented machine (FALLBACK).
"""

import argparse
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eagle3.params.params_file import Params

# Flag (as its attribute) -> dotted params key.
CONFIGURED: dict[str, str] = {
    "samples": "prepare.max_rows",
    "max_tokens": "extract.max_seq_len",
    "layers": "extract.aux_layer_ids",
    "storage": "extract.storage",
    "epochs": "train.epochs",
    "ttt_steps": "train.ttt_steps",
    "draft_vocab": "vocab.draft_vocab_size",
    "keep_checkpoints": "train.keep_checkpoints",
    "stream_buffer_gb": "train.stream_buffer_gb",
    "sharding": "train.sharding",
    "draft_layout": "train.draft_layout",
    "recompute": "train.activation_checkpointing",
    "optimizer": "train.optimizer",
    "batch_size": "train.batch_size",
    "max_tokens_per_batch": "train.max_tokens_per_batch",
    "gpus": "train.launch",
    "gpu": "train.launch.gpu",
}
# Flags the run itself answers: without a params file they are asked for (--samples) or measured, never taken from
# the shipped configuration's run.
RUN_INPUTS = ("samples", "max_tokens", "storage")
# What the shipped configuration leaves to the machine it runs on, where neither a flag nor a params file says.
FALLBACK = {"gpus": 8, "gpu": "b200"}
SHIPPED = "kimi-k2.5"


@cache
def shipped_params() -> "Params":
    """The shipped hero configuration, validated as a params file (layout B: stored states)."""
    import yaml

    from eagle3.init.shipped import CONFIGS_DIR, render
    from eagle3.params.loading import validate
    from eagle3.params.params_file import Params

    return validate(yaml.safe_load(render(SHIPPED, "B")), Params, CONFIGS_DIR / f"{SHIPPED}.yaml")


# Captured per token besides the aux layers: the final layer, always.
FINAL_LAYERS = 1
# The verifier's default aux layers, (2, N//2, N-3), are three.
DEFAULT_AUX_LAYERS = 3


@dataclass(frozen=True)
class Configured:
    """The params file the plan read (None: none there), what it configures, and its verifier's public name."""

    path: Path | None
    layout: str | None  # "C" for streamed states, "A or B" for stored ones
    verifier_name: str | None
    verifier_local: bool = False  # a `local` source: its directory may be on this machine
    params: "Params | None" = None


def _value(params: "Params", flag: str) -> Any:
    """The flag's value as the validated params give it, or None where they leave it to the flag (e.g. a process
    count of auto)."""
    section, name = CONFIGURED[flag].split(".", 1)
    if flag == "gpu":
        return params.train.launch.gpu
    value = getattr(getattr(params, section), name)
    if flag == "layers":
        return (len(value) if value is not None else DEFAULT_AUX_LAYERS) + FINAL_LAYERS
    if flag == "draft_layout":
        return tuple(name for name, on in value.model_dump().items() if on)
    if flag == "gpus":
        per_node = value.processes_per_node
        return None if per_node == "auto" else per_node * value.nodes
    return value


def apply(args: argparse.Namespace, params_path: Path) -> tuple[Configured, dict[str, str]]:
    """Fill every flag left unset from the params file (or the built-in default); {input: its source}."""
    sources: dict[str, str] = {}
    params = None
    if params_path.is_file():
        from eagle3.params.params_file import load_params

        params = load_params(params_path)
    for flag, key in CONFIGURED.items():
        given = getattr(args, flag)
        option = "--" + flag.replace("_", "-")
        if given is not None:
            sources[flag] = option
            continue
        value = _value(params, flag) if params is not None else None
        if value is not None:
            setattr(args, flag, value)
            sources[flag] = f"{params_path.name} {key}"
            continue
        shipped = None if params is not None or flag in RUN_INPUTS else _value(shipped_params(), flag)
        if shipped is not None:
            setattr(args, flag, shipped)
            sources[flag] = f"the shipped {SHIPPED} configuration's {key}"
        else:
            if flag in FALLBACK:
                setattr(args, flag, FALLBACK[flag])
            sources[flag] = f"default of {option}" + ("" if params is None else f" ({key} leaves it open)")
    if params is None and sources["optimizer"] != "--optimizer" and args.sharding == "fsdp":
        # What params accept: muon orthogonalises whole matrices, which fsdp splits.
        args.optimizer = "adamw"
        sources["optimizer"] = "default of --optimizer under --sharding fsdp"
    if params is None:
        return Configured(None, None, None), sources
    layout = "C" if params.train.hidden_states == "streamed" else "A or B"
    from eagle3.params.params_file import configured_verifier

    local = params.verifier.source.kind == "local"
    name = configured_verifier(params)
    return Configured(params_path, layout, name, local, params), sources
