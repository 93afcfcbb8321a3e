"""The pipeline's own safetensors files (the vocab, checkpoints) read back as untrusted: they travel through DVC
remotes like every output. A file that is not safetensors (truncated, random bytes, empty) is one error naming
it, and every tensor's name and shape is checked before any tensor is loaded, so loading allocates no more than
what the reader expects; dtypes are checked once loaded (at most 8 bytes a value whatever the file says).
"""

from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from eagle3.errors import Eagle3Error

Expected = dict[str, tuple[tuple[int, ...], torch.dtype]]


def _unreadable(path: Path, exc: Exception, fix: str) -> Eagle3Error:
    return Eagle3Error(f"{path}: not a readable safetensors file ({str(exc).splitlines()[0]}); {fix}")


def tensor_shapes(path: Path, fix: str) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape, from the file's header alone."""
    try:
        with safe_open(str(path), "pt") as handle:
            return {name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()}
    except (SafetensorError, OSError) as exc:
        raise _unreadable(path, exc, fix) from None


def load_tensors(path: Path, fix: str) -> dict[str, torch.Tensor]:
    """Every tensor of a file whose shapes the caller has checked (`tensor_shapes`)."""
    try:
        with safe_open(str(path), "pt") as handle:
            return {name: handle.get_tensor(name) for name in handle.keys()}
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
