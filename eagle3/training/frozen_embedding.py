"""The verifier's token embedding as both objectives (eagle3/training/objective.py, dflash_objective.py) hold it: a
buffer, not a frozen parameter, so nothing shards, synchronises or optimises it under DDP and FSDP alike."""

import torch
import torch.nn.functional as F
from torch import nn


class FrozenEmbedding(nn.Module):
    weight: torch.Tensor

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.register_buffer("weight", weight, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)
