"""Safetensors files read back as untrusted: the pipeline's own (the vocab, checkpoints, the exported draft) travel
through DVC remotes, and a verifier's come from wherever its directory did. A file that is not safetensors
(truncated, random bytes, empty, a header claiming more than the file holds) is one error naming it, and every
tensor's name and shape is checked before any tensor is loaded, so loading allocates no more than what the reader
expects; dtypes are checked once loaded (at most 8 bytes a value whatever the file says), or from the header
where the reader has no single dtype to expect.
"""

from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from eagle3.errors import Eagle3Error

Expected = dict[str, tuple[tuple[int, ...], torch.dtype]]
# safetensors' names of the floating dtypes a model's weights come in.
FLOAT_DTYPES = ("BF16", "F16", "F32", "F64")


def _unreadable(path: Path, exc: Exception, fix: str) -> Eagle3Error:
    return Eagle3Error(f"{path}: not a readable safetensors file ({str(exc).splitlines()[0]}); {fix}")


def tensor_headers(path: Path, fix: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """Each tensor's shape and dtype (as safetensors names it: "BF16", "I64"...), from the file's header alone."""
    try:
        with safe_open(str(path), "pt") as handle:
            slices = {name: handle.get_slice(name) for name in handle.keys()}
            return {name: (tuple(part.get_shape()), part.get_dtype()) for name, part in slices.items()}
    except (SafetensorError, OSError) as exc:
        raise _unreadable(path, exc, fix) from None


def tensor_shapes(path: Path, fix: str) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape, from the file's header alone."""
    return {name: shape for name, (shape, _) in tensor_headers(path, fix).items()}


def load_tensors(path: Path, fix: str) -> dict[str, torch.Tensor]:
    """Every tensor of a file whose shapes the caller has checked (`tensor_shapes`)."""
    try:
        with safe_open(str(path), "pt") as handle:
            return {name: handle.get_tensor(name) for name in handle.keys()}
    except (SafetensorError, OSError) as exc:
        raise _unreadable(path, exc, fix) from None


def load_tensor(path: Path, name: str, fix: str) -> torch.Tensor:
    """One tensor of a file, whose shape and dtype the caller has checked (`tensor_headers`)."""
    try:
        with safe_open(str(path), "pt") as handle:
            return handle.get_tensor(name)
    except (SafetensorError, OSError) as exc:
        raise _unreadable(path, exc, fix) from None


def matching_tensors(path: Path, expected: Expected, fix: str, every: bool = True) -> dict[str, torch.Tensor]:
    """The file's tensors, each of the name, shape and dtype `expected` gives it; with `every`, all of them."""
    shapes = tensor_shapes(path, fix)
    unexpected = sorted(set(shapes) - set(expected))
    missing = sorted(set(expected) - set(shapes)) if every else []
    if unexpected or missing:
        named = [f"{name} unexpected" for name in unexpected[:3]] + [f"{name} missing" for name in missing[:3]]
        raise Eagle3Error(f"{path}: not the tensors expected ({', '.join(named)}); {fix}")
    for name, shape in shapes.items():
        if shape != expected[name][0]:
            raise Eagle3Error(f"{path}: {name} has shape {list(shape)}, expected {list(expected[name][0])}; {fix}")
    tensors = load_tensors(path, fix)
    for name, tensor in tensors.items():
        if tensor.dtype != expected[name][1]:
            raise Eagle3Error(f"{path}: {name} is {tensor.dtype}, expected {expected[name][1]}; {fix}")
    return tensors
