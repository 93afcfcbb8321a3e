"""Training data: which samples form each global batch, how they are padded together, and fc's input scale.

Epoch e visits the samples in a permutation seeded by (seed, e), in global batches of `batch_size`
sequences; under torchrun rank r takes every world_size-th sequence of each batch. The order depends only on
the data and params, which is what makes resume exact and N processes train the same model as one.
"""

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from eagle3.errors import Eagle3Error
from eagle3.modeling.draft import DraftConfig

# Samples used to measure the per-channel scale of fc's input (their first token, an attention sink, excluded).
SCALE_SAMPLES = 64


class Collate:
    """Samples -> one padded batch. Knows the state shape, so a process's empty share of a batch (token-budget
    batching with more processes than sequences) is a batch of zero rows."""

    def __init__(self, layers: int, hidden: int):
        self.layers, self.hidden = layers, hidden

    @classmethod
    def for_draft(cls, config: DraftConfig) -> "Collate":
        """The shards a draft trains on hold its aux layers plus the final one."""
        return cls(len(config.aux_layer_ids) + 1, config.hidden_size)

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        longest = max((len(s["input_ids"]) for s in samples), default=0)
        rows, layers, hidden = len(samples), self.layers, self.hidden
        input_ids = torch.zeros(rows, longest, dtype=torch.int64)
        loss_mask = torch.zeros(rows, longest, dtype=torch.bool)
        states = torch.zeros(rows, longest, layers, hidden, dtype=torch.bfloat16)
        for row, sample in enumerate(samples):
            n = len(sample["input_ids"])
            input_ids[row, :n], loss_mask[row, :n] = sample["input_ids"], sample["loss_mask"]
            states[row, :n] = sample["hidden"].transpose(0, 1)
        return {
            "input_ids": input_ids,
            "loss_mask": loss_mask,
            "aux": states[:, :, :-1].reshape(rows, longest, (layers - 1) * hidden),
            "final": states[:, :, -1],
        }


class BatchPlan(torch.utils.data.Sampler):
    """This rank's share of every global batch from step `start` on (a resumed run sets it).

    Epoch e draws a permutation seeded by (seed, e); each window of 16 batches' worth of samples is sorted by
    length and cut into batches (little padding), and the epoch's batches are then shuffled with the same seed.
    A batch holds `batch_size` sequences or, with `max_tokens` set, as many (up to `batch_size`) as fit in
    `max_tokens` padded tokens (a longer sequence alone), so one 16K-token sample costs about what eight 2K ones
    do. Batches depend only on the data and params, never on the number of processes."""

    WINDOW = 16

    def __init__(
        self,
        lengths: torch.Tensor,
        batch_size: int,
        epochs: int,
        seed: int,
        rank: int = 0,
        world: int = 1,
        max_tokens: int | None = None,
        start: int = 0,
    ):
        self.lengths, self.batch_size, self.epochs, self.seed = lengths, batch_size, epochs, seed
        self.start, self.rank, self.world, self.max_tokens = start, rank, world, max_tokens
        if max_tokens is None:
            self.per_epoch = [len(lengths) // batch_size] * epochs
        else:
            self.per_epoch = [len(self.epoch(epoch)) for epoch in range(epochs)]
        self.total = sum(self.per_epoch)

    def __len__(self) -> int:
        return self.total - self.start

    def epoch(self, epoch: int) -> list[torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed * 100003 + epoch)
        order = torch.randperm(len(self.lengths), generator=generator)
        if self.max_tokens is None:
            order = order[: len(self.lengths) // self.batch_size * self.batch_size]
        batches = []
        for first in range(0, len(order), self.batch_size * self.WINDOW):
            window = order[first : first + self.batch_size * self.WINDOW]
            window = window[torch.argsort(self.lengths[window], stable=True)]
            batches += list(window.split(self.batch_size)) if self.max_tokens is None else self._fill(window)
        return [batches[i] for i in torch.randperm(len(batches), generator=generator)]

    def _fill(self, window: torch.Tensor) -> list[torch.Tensor]:
        """Cut a window sorted by length into batches of at most max_tokens padded tokens."""
        batches, first = [], 0
        for end, length in enumerate(self.lengths[window].tolist(), start=1):
            count = end - first
            if count > 1 and (count * length > self.max_tokens or count > self.batch_size):
                batches.append(window[first : end - 1])
                first = end - 1
        batches.append(window[first:])
        return batches

    def __iter__(self):
        done = 0
        for epoch, count in enumerate(self.per_epoch):
            if done + count > self.start:
                batches = self.epoch(epoch)
                for position in range(max(self.start - done, 0), count):
                    yield batches[position][self.rank :: self.world].tolist()
            done += count


def batches(loader: torch.utils.data.DataLoader) -> Iterator[dict[str, torch.Tensor]]:
    """The loader's batches. An Eagle3Error raised in a worker process (a damaged shard's ShardError) reaches
    this process as the same type holding the worker's whole traceback (torch re-raises it so); it is re-raised
    as its own message, the one line the CLI prints."""
    try:
        yield from loader
    except Eagle3Error as exc:
        kind = type(exc)
        last = str(exc).rstrip("\n").rsplit("\n", 1)[-1]
        raise kind(last.removeprefix(f"{kind.__module__}.{kind.__qualname__}: ")) from None


def measure_aux_scale(states: Iterable[torch.Tensor], layers: int) -> torch.Tensor:
    """Per-channel RMS of fc's input over `states` (the first SCALE_SAMPLES samples' [layers, tokens, hidden]),
    skipping each sequence's first (attention-sink) token."""
    squares, count = None, 0
    for hidden in states:
        aux = hidden[:layers, 1:].float()  # [layers, tokens, hidden]
        flat = aux.transpose(0, 1).reshape(aux.shape[1], -1)
        squares = flat.pow(2).sum(0) if squares is None else squares + flat.pow(2).sum(0)
        count += flat.shape[0]
    return (squares / max(count, 1)).sqrt().clamp(min=1e-2)
