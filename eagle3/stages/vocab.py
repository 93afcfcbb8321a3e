"""Stage `vocab`: the draft's output vocabulary, from what the verifier actually says.

Counts every loss-masked (assistant, reasoning included) token of the training
shards and keeps the `draft_vocab_size` most frequent; ties go to the lower
token id, so the result depends only on the data. If the answers use fewer
distinct tokens than that, the rest is filled with the most frequent other
tokens of the same sequences, then by id. Draft ids are assigned in ascending
target-id order.

Written to data/vocab/vocab.safetensors (format: eagle3/formats/vocab.py).
Coverage (the share of loss-masked tokens the draft can predict at all) goes
to metrics/vocab.json: it caps the achievable acceptance.
"""

from pathlib import Path

import torch

from eagle3.errors import Eagle3Error
from eagle3.files import write_json
from eagle3.formats.provenance import read_provenance
from eagle3.formats.shards import ShardReader, read_index, split_shards
from eagle3.formats.vocab import save_vocab
from eagle3.params.base import StageParams
from eagle3.params.vocab import VocabParams
from eagle3.paths import VOCAB_DIR, VOCAB_METRICS
from eagle3.progress import progress, step


class Params(StageParams):
    vocab: VocabParams = VocabParams()


def count_tokens(root: Path, split: str, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss-masked counts, all-token counts) over a split's shards, each int64 [vocab_size]. Reads only each
    record's token ids and loss mask (checksum-verified, every id below vocab_size; the hidden states, all but a
    few bytes per token, stay compressed) and keeps one shard file open at a time."""
    masked = torch.zeros(vocab_size, dtype=torch.int64)
    every = torch.zeros(vocab_size, dtype=torch.int64)
    paths = split_shards(root, split)
    samples = sum(entry["samples"] for entry in read_index(root)["splits"][split])
    with progress() as bar:
        task = bar.add_task("vocab (samples)", total=samples)
        for path in paths:
            reader = ShardReader(path, vocab_size)
            try:
                # One bincount per shard: a vocabulary-sized count per sample would cost more than the decoding.
                answers, tokens = [], []
                for position in range(len(reader)):
                    input_ids, loss_mask = reader.read_tokens(position)
                    answers.append(input_ids[loss_mask])
                    tokens.append(input_ids)
                    bar.advance(task)
                if tokens:
                    masked += torch.bincount(torch.cat(answers), minlength=vocab_size)
                    every += torch.bincount(torch.cat(tokens), minlength=vocab_size)
            finally:
                reader.close()
    return masked, every


def select(masked: torch.Tensor, every: torch.Tensor, size: int) -> torch.Tensor:
    """Target ids of the draft vocab, ascending: most frequent loss-masked tokens first, then other tokens."""
    ids = torch.arange(len(masked))
    # Lexicographic (masked count desc, all count desc, id asc), from a stable sort on each key in reverse order.
    order = ids
    for key in (every, masked):
        order = order[torch.argsort(-key[order], stable=True)]
    return torch.sort(order[:size]).values


def mapping(chosen: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    d2t = (chosen - torch.arange(len(chosen))).to(torch.int64)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[chosen] = True
    return d2t, t2d


def run(params: Params, root: Path, options=None) -> None:
    config = params.vocab
    vocab_size = read_provenance(root).vocab_size
    if config.draft_vocab_size > vocab_size:
        raise Eagle3Error(
            f"vocab.draft_vocab_size: {config.draft_vocab_size} exceeds the verifier's vocab size {vocab_size}"
        )
    masked, every = count_tokens(root, "train", vocab_size)
    total = int(masked.sum())
    if total == 0:
        raise Eagle3Error(f"{root / VOCAB_DIR}: the training shards hold no loss-masked tokens; check data/synthetic")
    chosen = select(masked, every, config.draft_vocab_size)
    save_vocab(root, *mapping(chosen, vocab_size))
    covered = int(masked[chosen].sum())
    distinct = int((masked > 0).sum())
    metrics = {
        "draft_vocab_size": config.draft_vocab_size,
        "verifier_vocab_size": vocab_size,
        "loss_tokens": total,
        "distinct_loss_tokens": distinct,
        "coverage": round(covered / total, 6),
        "uncovered_loss_tokens": total - covered,
    }
    write_json(root / VOCAB_METRICS, metrics)
    step(
        f"vocab: {config.draft_vocab_size} draft tokens cover {metrics['coverage']:.2%} of {total} loss tokens "
        f"({distinct} distinct in the answers)"
    )
