"""Which planned sequences go into each forward pass of a capture backend, and the states handed back in plan order.

Shard bytes must depend only on the data and the params, never on batching or on which shards a resumed run
still had to make: batches are cut from a whole part the same way every run, and states leave `in_plan_order`.
"""

from collections.abc import Iterator

import torch

from eagle3.chat.token_layout import Sequence
from eagle3.engines.hidden_states.base import HiddenStateCapture


def part_batches(shards: list[list[Sequence]], batch_tokens: int, padded: bool) -> list[list[int]]:
    """Batches of a part, as positions in its sequences (`shards`: each shard's sequences, in plan order). Padded
    batches (the `hf` backend) are length-sorted within each shard: a batch pads to its longest sequence, so
    neighbours in length waste little (benchmarks/extract.py measures the padding against plan order), and at most
    one shard's states wait to be written in plan order. Unpadded batches (`vllm`: no padding) are consecutive in
    plan order across shard boundaries, `batch_tokens` real tokens each, so the engine is filled however small the
    shards and one batch's states wait."""
    if not padded:
        batches: list[list[int]] = []
        current: list[int] = []
        tokens, position = 0, 0
        for shard in shards:
            for sequence in shard:
                if current and tokens + len(sequence.input_ids) > batch_tokens:
                    batches.append(current)
                    current, tokens = [], 0
                current.append(position)
                tokens += len(sequence.input_ids)
                position += 1
        return batches + [current] if current else batches
    batches, offset = [], 0
    for shard in shards:
        batches += [[offset + i for i in batch] for batch in length_sorted_batches(shard, batch_tokens)]
        offset += len(shard)
    return batches


def length_sorted_batches(sequences: list[Sequence], batch_tokens: int) -> list[list[int]]:
    """Positions in `sequences`, shortest first, cut into batches of up to `batch_tokens` padded tokens."""
    return cut_batches(
        sequences, sorted(range(len(sequences)), key=lambda i: len(sequences[i].input_ids)), batch_tokens
    )


def cut_batches(sequences: list[Sequence], order: list[int], batch_tokens: int) -> list[list[int]]:
    """Positions in `order`, cut into consecutive batches whose padded size (count x longest) fits `batch_tokens`."""
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for position in order:
        length = len(sequences[position].input_ids)
        if current and (len(current) + 1) * max(longest, length) > batch_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(position)
        longest = max(longest, length)
    if current:
        batches.append(current)
    return batches


def in_plan_order(
    backend: HiddenStateCapture, sequences: list[Sequence], batches: list[list[int]], wanted: list[int]
) -> Iterator[tuple[int, torch.Tensor]]:
    """Run `batches` (positions in `sequences`) and hand on the states of the `wanted` positions (ascending) in
    that order, each as soon as all before it are done, so bytes depend only on data and params. Holds the states
    of wanted positions computed ahead of their turn, and no others."""
    keep = set(wanted)
    ready: dict[int, torch.Tensor] = {}
    upcoming = iter(wanted)
    position = next(upcoming, None)
    for batch in batches:
        for index, hidden in zip(batch, backend.forward([sequences[i] for i in batch]), strict=True):
            if index in keep:
                ready[index] = hidden
        while position is not None and position in ready:
            yield position, ready.pop(position)
            position = next(upcoming, None)
