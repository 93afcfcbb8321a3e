"""The few verifier tensors the pipeline reads straight from its safetensors checkpoint, without loading the
model: token embeddings (the draft's frozen input), lm_head (the training target distribution) and the final
norm (applied to vLLM's captured last layer). For a sharded 600 GB checkpoint only the files holding them are
opened, through model.safetensors.index.json."""

import json
from pathlib import Path

import torch
from safetensors import safe_open

from eagle3.errors import Eagle3Error
from eagle3.formats.hf_config import read_config, text_config

INDEX = "model.safetensors.index.json"


def _weight_files(model_dir: Path) -> dict[str, Path]:
    index = model_dir / INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        return {name: model_dir / file for name, file in weight_map.items()}
    single = model_dir / "model.safetensors"
    if not single.is_file():
        raise Eagle3Error(f"{model_dir}: no model.safetensors or {INDEX} (safetensors weights needed)")
    with safe_open(str(single), "pt") as handle:
        return {name: single for name in handle.keys()}


def _find(files: dict[str, Path], suffix: str) -> str | None:
    # Shortest match: "model.embed_tokens.weight" before e.g. a vision tower's embeddings.
    matches = sorted((name for name in files if name.endswith(suffix)), key=len)
    return matches[0] if matches else None


def _read(files: dict[str, Path], name: str) -> torch.Tensor:
    with safe_open(str(files[name]), "pt") as handle:
        return handle.get_tensor(name)


def load_verifier_tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    """{"embed": [V, H], "lm_head": [V, H]}; a tied verifier's lm_head is its embedding matrix."""
    files = _weight_files(model_dir)
    embed_name = _find(files, "embed_tokens.weight")
    if embed_name is None:
        raise Eagle3Error(f"{model_dir}: no *embed_tokens.weight tensor among the verifier's weights")
    head_name = _find(files, "lm_head.weight") or embed_name
    return {"embed": _read(files, embed_name), "lm_head": _read(files, head_name)}


def final_norm(model_dir: Path) -> tuple[torch.Tensor, float]:
    """The verifier's final RMSNorm (weight, eps): `*model.norm.weight` outside the layers, eps from its config."""
    eps = text_config(read_config(model_dir)).get("rms_norm_eps")
    if eps is None:
        raise Eagle3Error(
            f"{model_dir}/config.json: no rms_norm_eps; extract.backend vllm supports RMSNorm verifiers "
            "only (set extract.backend: hf)"
        )
    files = _weight_files(model_dir)
    names = [name for name in files if name.endswith("model.norm.weight") and ".layers." not in name]
    if len(names) != 1:
        raise Eagle3Error(
            f"{model_dir}: expected one final norm weight (*model.norm.weight), found {sorted(names)}; "
            "set extract.backend: hf"
        )
    return _read(files, names[0]), float(eps)
