"""The few verifier tensors the pipeline reads straight from its safetensors checkpoint, without loading the
model: token embeddings (the draft's frozen input), lm_head (the training target distribution) and the final
norm (applied to vLLM's captured last layer). For a sharded 600 GB checkpoint only the files holding them are
opened, through model.safetensors.index.json.

Read as untrusted (eagle3/formats/hf_config.py): the index's file names must lie beside it, and each tensor must
be in the file named for it, of a float dtype and of the shape the config gives it ([vocab_size, hidden_size],
[hidden_size]), all checked from the headers before the tensor is loaded."""

from pathlib import Path

import torch

from eagle3.errors import Eagle3Error
from eagle3.formats.hf_config import CONFIG, WEIGHT_INDEX, read_config, require, weight_index
from eagle3.formats.tensor_files import FLOAT_DTYPES, load_tensor, tensor_headers, tensor_shapes

_FIX = "restore the verifier's weights from its source"


def _weight_files(model_dir: Path) -> dict[str, Path]:
    if (model_dir / WEIGHT_INDEX).is_file():
        return {name: model_dir / file for name, file in weight_index(model_dir, _FIX).items()}
    single = model_dir / "model.safetensors"
    if not single.is_file():
        raise Eagle3Error(f"{model_dir}: no model.safetensors or {WEIGHT_INDEX} (safetensors weights needed)")
    return {name: single for name in tensor_shapes(single, _FIX)}


def _find(files: dict[str, Path], suffix: str) -> str | None:
    # Shortest match: "model.embed_tokens.weight" before e.g. a vision tower's embeddings.
    matches = sorted((name for name in files if name.endswith(suffix)), key=len)
    return matches[0] if matches else None


def _read(files: dict[str, Path], name: str, shape: tuple[int, ...]) -> torch.Tensor:
    path = files[name]
    headers = tensor_headers(path, _FIX)
    if name not in headers:
        raise Eagle3Error(f"{path}: no tensor {name}, which {WEIGHT_INDEX} places in it; {_FIX}")
    stored, dtype = headers[name]
    if stored != shape:
        raise Eagle3Error(f"{path}: {name} has shape {list(stored)}, the config makes it {list(shape)}; {_FIX}")
    if dtype not in FLOAT_DTYPES:
        raise Eagle3Error(f"{path}: {name} has dtype {dtype}, expected a float ({', '.join(FLOAT_DTYPES)}); {_FIX}")
    return load_tensor(path, name, _FIX)


def load_verifier_tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    """{"embed": [V, H], "lm_head": [V, H]}; a tied verifier's lm_head is its embedding matrix."""
    keys = ("vocab_size", "hidden_size")
    text = require(model_dir / CONFIG, read_config(model_dir), keys, "the verifier's embeddings are sized by it")
    shape = (text["vocab_size"], text["hidden_size"])
    files = _weight_files(model_dir)
    embed_name = _find(files, "embed_tokens.weight")
    if embed_name is None:
        raise Eagle3Error(f"{model_dir}: no *embed_tokens.weight tensor among the verifier's weights")
    head_name = _find(files, "lm_head.weight") or embed_name
    return {"embed": _read(files, embed_name, shape), "lm_head": _read(files, head_name, shape)}


def final_norm(model_dir: Path) -> tuple[torch.Tensor, float]:
    """The verifier's final RMSNorm (weight, eps): `*model.norm.weight` outside the layers, eps from its config."""
    text = require(model_dir / CONFIG, read_config(model_dir), ("hidden_size",), "the final norm is sized by it")
    eps = text.get("rms_norm_eps")
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
    return _read(files, names[0], (text["hidden_size"],)), float(eps)
