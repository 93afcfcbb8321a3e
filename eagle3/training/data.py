"""Training data: which samples form each global batch, how they are padded together, and fc's input scale.

Epoch e visits the samples in a permutation seeded by (seed, e), in global batches (BatchPlan). The batches
depend only on the data and params, which is what makes resume exact and N processes train the same model as
one. Under torchrun the processes share each batch by tokens (`balanced_shares`), and a process whose share is
more than its part of train.max_tokens_per_batch trains it in micro-batches that each fit that part
(`micro_batches`), accumulating their gradients into the one optimizer step: no process ever holds more padded
tokens at once than max_tokens_per_batch / processes, or one sequence longer than that.
"""

import os
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

import torch

from eagle3.errors import Eagle3Error
from eagle3.modeling.drafts import AnyDraftConfig
from eagle3.params.train import TrainParams
from eagle3.training.distributed import Dist

# Samples used to measure the per-channel scale of fc's input (their first token, an attention sink, excluded).
SCALE_SAMPLES = 64
# Batches each DataLoader worker prepares ahead of the trainer.
PREFETCH_BATCHES = 4


class Collate:
    """Samples -> one padded batch. Knows the state shape, so a process's empty share of a batch (token-budget
    batching with more processes than sequences) is a batch of zero rows."""

    def __init__(self, layers: int, hidden: int):
        self.layers, self.hidden = layers, hidden

    @classmethod
    def for_draft(cls, config: AnyDraftConfig) -> "Collate":
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


class TrainingData(Protocol):
    """The training split as the train stage reads it: stored shards (eagle3/training/stored.py) or states the
    verifier computes for each batch (eagle3/training/streamed.py). The same sequences in the same batches
    either way: a sample's position indexes `lengths`, which BatchPlan batches by."""

    layer_ids: tuple[int, ...]
    lengths: torch.Tensor

    def __len__(self) -> int: ...

    def identity(self) -> dict[str, Any]:
        """What the run key records of where the states come from."""
        ...

    def begin(self, plan: "BatchPlan", config: TrainParams, collate: Collate, fresh: bool) -> torch.Tensor | None:
        """Before the first batch of `plan` (from plan.start): fc's input scale where `fresh`, else None."""
        ...

    def batches(self, plan: "BatchPlan", config: TrainParams, collate: Collate) -> Iterator[dict[str, torch.Tensor]]:
        """This process's collated micro-batches from plan.start on, in the plan's order."""
        ...

    def summary(self) -> dict[str, Any]:
        """What the run's metrics record of the data (rank 0)."""
        ...

    def close(self) -> None: ...


def tokens_per_process(max_tokens_per_batch: int | None, batch_size: int, processes: int, longest: int) -> int:
    """The most padded tokens one training process holds at once (one micro-batch), what its memory is sized for:
    under a token budget its part of it, or one longest sequence where that is more; without, its
    batch_size / processes sequences (rounded up), each as long as the longest."""
    if max_tokens_per_batch is not None:
        return max(max_tokens_per_batch // processes, longest)
    return -(-batch_size // processes) * longest


def loader_shared_memory(tokens: int, layers: int, hidden: int, workers: int) -> int:
    """Bytes one training process's DataLoader workers may hold in shared memory (/dev/shm, where worker
    processes hand their batches over) at once: each worker's prefetched batches of `tokens` padded tokens of
    bf16 states (`layers` captured layers of `hidden` values)."""
    return workers * PREFETCH_BATCHES * tokens * layers * hidden * 2


def balanced_shares(batch: list[int], lengths: torch.Tensor, world_size: int) -> list[list[int]]:
    """A global batch's sequences over `world_size` processes by tokens: longest first, each to the process holding
    the fewest tokens so far (the lowest rank on a tie); every share keeps the batch's order."""
    if world_size == 1:
        return [list(batch)]
    held, owner = [0] * world_size, {}
    for position in sorted(batch, key=lambda p: -int(lengths[p])):
        rank = min(range(world_size), key=lambda r: (held[r], r))
        owner[position] = rank
        held[rank] += int(lengths[position])
    return [[p for p in batch if owner[p] == rank] for rank in range(world_size)]


def padded_cuts(lengths: list[int], budget: int, most: int | None = None) -> list[tuple[int, int]]:
    """(first, end) ranges cutting ascending `lengths` into runs of at most `budget` padded tokens (count x the
    run's last, longest; a longer one alone) and at most `most` entries."""
    ranges, first = [], 0
    for end, length in enumerate(lengths, start=1):
        count = end - first
        if count > 1 and (count * length > budget or (most is not None and count > most)):
            ranges.append((first, end - 1))
            first = end - 1
    ranges.append((first, len(lengths)))
    return ranges


def micro_batches(share: list[int], lengths: torch.Tensor, budget: int | None) -> list[list[int]]:
    """A process's share in micro-batches of at most `budget` padded tokens (count x longest; a longer sequence
    alone): the whole share, in its order, where it fits, else cut shortest first."""
    if not share or budget is None or len(share) * max(int(lengths[p]) for p in share) <= budget:
        return [list(share)]
    ordered = sorted(share, key=lambda p: (int(lengths[p]), p))
    return [ordered[a:b] for a, b in padded_cuts([int(lengths[p]) for p in ordered], budget)]


class BatchPlan(torch.utils.data.Sampler):
    """This rank's micro-batches of every global batch from step `start` on (a resumed run sets it).

    Epoch e draws a permutation seeded by (seed, e); each window of 16 batches' worth of samples is sorted by
    length and cut into batches (little padding), and the epoch's batches are then shuffled with the same seed.
    A batch holds `batch_size` sequences or, with `max_tokens` set, as many (up to `batch_size`) as fit in
    `max_tokens` padded tokens (a longer sequence alone), so one 16K-token sample costs about what eight 2K ones
    do. Batches depend only on the data and params, never on the number of processes; each step every rank
    runs the same number of micro-batches (`micro_counts`), empty ones where its share has fewer."""

    WINDOW = 16

    def __init__(
        self,
        lengths: torch.Tensor,
        batch_size: int,
        epochs: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        max_tokens: int | None = None,
        start: int = 0,
    ):
        self.lengths, self.batch_size, self.epochs, self.seed = lengths, batch_size, epochs, seed
        self.start, self.rank, self.world_size, self.max_tokens = start, rank, world_size, max_tokens
        # What one process holds at once: its part of the global token budget.
        self.budget = None if max_tokens is None else max(max_tokens // world_size, 1)
        if max_tokens is None:
            self.per_epoch = [len(lengths) // batch_size] * epochs
        else:
            self.per_epoch = [len(self.epoch(epoch)) for epoch in range(epochs)]
        self.total = sum(self.per_epoch)

    def __len__(self) -> int:
        return sum(self.micro_counts())

    def epoch(self, epoch: int) -> list[torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed * 100003 + epoch)
        order = torch.randperm(len(self.lengths), generator=generator)
        if self.max_tokens is None:
            order = order[: len(self.lengths) // self.batch_size * self.batch_size]
        batches: list[torch.Tensor] = []
        for first in range(0, len(order), self.batch_size * self.WINDOW):
            window = order[first : first + self.batch_size * self.WINDOW]
            window = window[torch.argsort(self.lengths[window], stable=True)]
            if self.max_tokens is None:
                batches += list(window.split(self.batch_size))
            else:
                batches += self._fill(window, self.max_tokens)
        return [batches[i] for i in torch.randperm(len(batches), generator=generator)]

    def _fill(self, window: torch.Tensor, max_tokens: int) -> list[torch.Tensor]:
        """Cut a window sorted by length into batches of at most max_tokens padded tokens."""
        return [window[a:b] for a, b in padded_cuts(self.lengths[window].tolist(), max_tokens, self.batch_size)]

    def global_batches(self) -> Iterator[list[int]]:
        """Every global batch from `start` on, as sample positions."""
        done = 0
        for epoch, count in enumerate(self.per_epoch):
            if done + count > self.start:
                batches = self.epoch(epoch)
                for position in range(max(self.start - done, 0), count):
                    yield batches[position].tolist()
            done += count

    def shares(self, batch: list[int]) -> list[list[int]]:
        """Each rank's share of a global batch: by tokens under a token budget; else batch_size / world_size
        sequences each (every world_size-th), which bounds a share at that many of the longest sequences."""
        if self.max_tokens is None:
            return [batch[rank :: self.world_size] for rank in range(self.world_size)]
        return balanced_shares(batch, self.lengths, self.world_size)

    def rank_micro_batches(self, batch: list[int]) -> list[list[int]]:
        """This rank's micro-batches of a global batch, padded with empty ones to the most any rank has."""
        parts = [micro_batches(share, self.lengths, self.budget) for share in self.shares(batch)]
        count = max(len(p) for p in parts)
        return parts[self.rank] + [[] for _ in range(count - len(parts[self.rank]))]

    def steps(self) -> Iterator[list[list[int]]]:
        """This rank's micro-batches of each step from `start` on."""
        return (self.rank_micro_batches(batch) for batch in self.global_batches())

    def micro_counts(self) -> Iterator[int]:
        """Micro-batches per step from `start` on: the same on every rank."""
        return (len(micro) for micro in self.steps())

    def __iter__(self) -> Iterator[list[int]]:
        for micro in self.steps():
            yield from micro


def loader_batches(loader: torch.utils.data.DataLoader) -> Iterator[dict[str, torch.Tensor]]:
    """The loader's batches. An Eagle3Error raised in a worker process (a damaged shard's ShardError) reaches
    this process as the same type holding the worker's whole traceback (torch re-raises it so); it is re-raised
    as its own message, the one line the CLI prints."""
    try:
        yield from loader
    except Eagle3Error as exc:
        kind = type(exc)
        last = str(exc).rstrip("\n").rsplit("\n", 1)[-1]
        raise kind(last.removeprefix(f"{kind.__module__}.{kind.__qualname__}: ")) from None


def micro_batches_by_step(loaded: Iterator[Any], counts: Iterable[int]) -> Iterator[list[Any]]:
    """The loaded micro-batches grouped into optimizer steps (`counts`: BatchPlan.micro_counts). Ends by running
    the loader to its end, so what it does after its last batch (a streamed run's spool clean-up, the workers'
    shutdown) happens; a loader with batches left over is a bug, refused."""
    for count in counts:
        yield [next(loaded) for _ in range(count)]
    if next(loaded, None) is not None:
        raise RuntimeError("the loader has more batches than the plan's steps")


def measure_aux_scale(states: Iterable[torch.Tensor], layers: int) -> torch.Tensor:
    """Per-channel RMS of fc's input over `states` (the first SCALE_SAMPLES samples' [layers, tokens, hidden]),
    skipping each sequence's first (attention-sink) token."""
    squares: torch.Tensor | None = None
    count = 0
    for hidden in states:
        aux = hidden[:layers, 1:].float()  # [layers, tokens, hidden]
        flat = aux.transpose(0, 1).reshape(aux.shape[1], -1)
        squares = flat.pow(2).sum(0) if squares is None else squares + flat.pow(2).sum(0)
        count += flat.shape[0]
    if squares is None:
        raise ValueError("fc's input scale needs at least one sample's states")
    return (squares / max(count, 1)).sqrt().clamp(min=1e-2)


def data_workers(config: TrainParams, world: Dist) -> int:
    """DataLoader processes per training process. `auto`: one decodes ~870 MB/s of bf16 states on a server core
    (~15K Kimi-K2.5 tokens/s) while a GPU trains ~7K tokens/s, so 2 per GPU process keep it fed with headroom
    for long samples; on CPU one, since every worker takes a core from the training itself."""
    if config.num_workers != "auto":
        return config.num_workers
    wanted = 2 if world.device.type == "cuda" else 1
    return max(0, min(wanted, (os.cpu_count() or 1) // max(world.local_size, 1) - 1))
