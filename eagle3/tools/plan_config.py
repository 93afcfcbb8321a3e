"""What the project's configuration decides for `eagle3 plan`: every flag it answers (TTT steps, draft vocabulary,
epochs, the longest sample, storage, layers captured, checkpoints kept, the stream buffer, sharding, recompute,
processes, the optimizer and the batches) comes from the params file unless the flag is given, and each input's
source is named beside it ("params.yaml train.ttt_steps"). Without a params file the flags' built-in defaults
apply, named as such.
"""

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eagle3.config import Params

# Flag (as its attribute) -> (dotted params key, the built-in default where no params file is there).
CONFIGURED: dict[str, tuple[str, Any]] = {
    "samples": ("prepare.max_rows", None),
    "max_tokens": ("extract.max_seq_len", None),
    "layers": ("extract.aux_layer_ids", 4),
    "storage": ("extract.storage", None),
    "epochs": ("train.epochs", 4),
    "ttt_steps": ("train.ttt_steps", 7),
    "draft_vocab": ("vocab.draft_vocab_size", 32000),
    "keep_checkpoints": ("train.keep_checkpoints", 3),
    "stream_buffer_gb": ("train.stream_buffer_gb", 64.0),
    "sharding": ("train.sharding", "ddp"),
    "draft_layout": ("train.draft_layout", ()),
    "recompute": ("train.activation_checkpointing", "off"),
    "optimizer": ("train.optimizer", "muon"),
    "batch_size": ("train.batch_size", 16),
    "max_tokens_per_batch": ("train.max_tokens_per_batch", None),
    "gpus": ("train.launch", 8),
    "gpu": ("train.launch.gpu", "b200"),
}
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
    key, _ = CONFIGURED[flag]
    section, name = key.split(".", 1)
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
        from eagle3.config import load_params

        params = load_params(params_path)
    for flag, (key, default) in CONFIGURED.items():
        given = getattr(args, flag)
        option = "--" + flag.replace("_", "-")
        if given is not None:
            sources[flag] = option
            continue
        value = _value(params, flag) if params is not None else None
        if value is not None:
            setattr(args, flag, value)
            sources[flag] = f"{params_path.name} {key}"
        else:
            if default is not None:
                setattr(args, flag, default)
            sources[flag] = f"default of {option}" + ("" if params is None else f" ({key} leaves it open)")
    if sources["optimizer"].startswith("default") and args.sharding == "fsdp":
        # What params accept: muon orthogonalises whole matrices, which fsdp splits.
        args.optimizer = "adamw"
        sources["optimizer"] = "default of --optimizer under --sharding fsdp"
    if params is None:
        return Configured(None, None, None), sources
    layout = "C" if params.train.hidden_states == "streamed" else "A or B"
    source = params.verifier.source
    local = source.kind == "local"
    name = source.name if local else source.upstream_model
    return Configured(params_path, layout, name, local, params), sources
