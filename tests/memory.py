"""Measuring the memory a piece of PyTorch code allocates, on CPU where there is no allocator statistic."""

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class PeakBytes(TorchDispatchMode):
    """Peak bytes of tensor storage allocated by the ops run under it (inputs made before it excluded); a storage
    counts until the last reference to it, the autograd graph's included, is gone."""

    def __init__(self):
        super().__init__()
        self.live, self.peak, self.storages = 0, 0, set()

    def _free(self, pointer: int, size: int) -> None:
        self.storages.discard(pointer)
        self.live -= size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                storage = tensor.untyped_storage()
                pointer, size = storage.data_ptr(), storage.nbytes()
                if size and pointer not in self.storages:
                    self.storages.add(pointer)
                    self.live += size
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(storage, self._free, pointer, size)
        return out
