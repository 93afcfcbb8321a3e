"""The two verifier tensors the draft needs, read without loading the verifier: token embeddings (frozen draft
input) and lm_head (the target distribution). For a sharded 600 GB checkpoint only the files holding them are
opened, through model.safetensors.index.json."""

import json
from pathlib import Path

import torch
from safetensors import safe_open

from eagle3.errors import Eagle3Error


def _weight_files(model_dir: Path) -> dict[str, Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        return {name: model_dir / file for name, file in weight_map.items()}
    single = model_dir / "model.safetensors"
    if not single.is_file():
        raise Eagle3Error(f"{model_dir}: no model.safetensors or model.safetensors.index.json (safetensors weights needed)")
    with safe_open(str(single), "pt") as handle:
        return {name: single for name in handle.keys()}


def _find(files: dict[str, Path], suffix: str) -> str | None:
    # Shortest match: "model.embed_tokens.weight" before e.g. a vision tower's embeddings.
    matches = sorted((name for name in files if name.endswith(suffix)), key=len)
    return matches[0] if matches else None


def load_verifier_tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    """{"embed": [V, H], "lm_head": [V, H]}; a tied verifier's lm_head is its embedding matrix."""
    files = _weight_files(model_dir)
    embed_name = _find(files, "embed_tokens.weight")
    if embed_name is None:
        raise Eagle3Error(f"{model_dir}: no *embed_tokens.weight tensor among the verifier's weights")
    head_name = _find(files, "lm_head.weight") or embed_name
    tensors = {}
    for key, name in (("embed", embed_name), ("lm_head", head_name)):
        with safe_open(str(files[name]), "pt") as handle:
            tensors[key] = handle.get_tensor(name)
    return tensors
