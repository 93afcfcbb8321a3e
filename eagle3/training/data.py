"""Training data: which samples form each global batch, how they are padded together, and fc's input scale.

Epoch e visits the samples in a permutation seeded by (seed, e), in global batches of `batch_size`
sequences; under torchrun rank r takes every world_size-th sequence of each batch. The order depends only on
the data and params, which is what makes resume exact and N processes train the same model as one.
"""

from typing import Any

import torch

from eagle3.formats.shards import HiddenStateDataset

# Samples used to measure the per-channel scale of fc's input (their first token, an attention sink, excluded).
SCALE_SAMPLES = 64


def collate(samples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    longest = max(len(s["input_ids"]) for s in samples)
    layers, _, hidden = samples[0]["hidden"].shape
    input_ids = torch.zeros(len(samples), longest, dtype=torch.int64)
    loss_mask = torch.zeros(len(samples), longest, dtype=torch.bool)
    states = torch.zeros(len(samples), longest, layers, hidden, dtype=torch.bfloat16)
    for row, sample in enumerate(samples):
        n = len(sample["input_ids"])
        input_ids[row, :n], loss_mask[row, :n] = sample["input_ids"], sample["loss_mask"]
        states[row, :n] = sample["hidden"].transpose(0, 1)
    return {
        "input_ids": input_ids,
        "loss_mask": loss_mask,
        "aux": states[:, :, :-1].reshape(len(samples), longest, (layers - 1) * hidden),
        "final": states[:, :, -1],
    }


class BatchPlan(torch.utils.data.Sampler):
    """This rank's share of every global batch from step `start` on.

    Epoch e draws a permutation seeded by (seed, e); each window of 16 batches' worth of samples is sorted by
    length and cut into batches (little padding), and the epoch's batches are then shuffled with the same seed."""

    WINDOW = 16

    def __init__(
        self, lengths: torch.Tensor, batch_size: int, epochs: int, seed: int, start: int, rank: int, world: int
    ):
        self.lengths, self.batch_size, self.epochs, self.seed = lengths, batch_size, epochs, seed
        self.start, self.rank, self.world = start, rank, world
        self.per_epoch = len(lengths) // batch_size

    def __len__(self) -> int:
        return self.per_epoch * self.epochs - self.start

    def epoch(self, epoch: int) -> list[torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed * 100003 + epoch)
        order = torch.randperm(len(self.lengths), generator=generator)[: self.per_epoch * self.batch_size]
        batches = []
        for first in range(0, len(order), self.batch_size * self.WINDOW):
            window = order[first : first + self.batch_size * self.WINDOW]
            window = window[torch.argsort(self.lengths[window], stable=True)]
            batches += list(window.split(self.batch_size))
        return [batches[i] for i in torch.randperm(len(batches), generator=generator)]

    def __iter__(self):
        for epoch in range(self.start // self.per_epoch, self.epochs):
            batches = self.epoch(epoch)
            for position in range(max(self.start - epoch * self.per_epoch, 0), self.per_epoch):
                yield batches[position][self.rank :: self.world].tolist()


def measure_aux_scale(dataset: HiddenStateDataset, layers: int) -> torch.Tensor:
    """Per-channel RMS of fc's input over the first samples, skipping each sequence's first (attention-sink) token."""
    squares, count = None, 0
    for position in range(min(SCALE_SAMPLES, len(dataset))):
        aux = dataset[position]["hidden"][:layers, 1:].float()  # [layers, tokens, hidden]
        flat = aux.transpose(0, 1).reshape(aux.shape[1], -1)
        squares = flat.pow(2).sum(0) if squares is None else squares + flat.pow(2).sum(0)
        count += flat.shape[0]
    return (squares / max(count, 1)).sqrt().clamp(min=1e-2)
