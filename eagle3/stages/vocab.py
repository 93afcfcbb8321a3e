"""Stage `vocab`: the draft's output vocabulary, from what the verifier actually says.

Counts every loss-masked (assistant, reasoning included) token of the training
sequences, laid out from the synthetic data exactly as extract stores them
(eagle3/chat/sequence_plan.py: the same tokens whether the states are stored or
streamed), and keeps the `draft_vocab_size` most frequent; ties go to the lower
token id, so the result depends only on the data. If the answers use fewer
distinct tokens than that, the rest is filled with the most frequent other
tokens of the same sequences, then by id. Draft ids are assigned in ascending
target-id order.

Written to data/vocab/vocab.safetensors (format: eagle3/formats/vocab.py).
Coverage (the share of loss-masked tokens the draft can predict at all) goes
to metrics/vocab.json: it caps the achievable acceptance.
"""

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from eagle3.chat.sequence_plan import Part, load_tokenizer, split_sequences, synthetic_parts
from eagle3.errors import Eagle3Error
from eagle3.files import write_json
from eagle3.formats.provenance import read_provenance
from eagle3.formats.vocab import save_vocab
from eagle3.params.base import StageParams
from eagle3.params.extract import ExtractParams
from eagle3.params.vocab import VocabParams
from eagle3.paths import SYNTHETIC_DIR, VOCAB_METRICS
from eagle3.progress import progress, status

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class Params(StageParams):
    vocab: VocabParams = VocabParams()
    # The sequences are laid out as extract lays them out (extract.max_seq_len cuts them).
    extract: ExtractParams


def count_tokens(
    root: Path, parts: list[Part], tokenizer: "PreTrainedTokenizerBase", max_seq_len: int, vocab_size: int
):
    """(loss-masked counts, all-token counts) over the parts' training sequences, each int64 [vocab_size]; a
    token id outside the verifier's vocabulary is one error naming its sample."""
    masked = torch.zeros(vocab_size, dtype=torch.int64)
    every = torch.zeros(vocab_size, dtype=torch.int64)
    with progress() as bar:
        task = bar.add_task("vocab (parts)", total=len(parts))
        for sequences in split_sequences(parts, tokenizer, max_seq_len):
            # One bincount per part: a vocabulary-sized count per sample would cost more than the layout.
            for sequence in sequences:
                if int(sequence.input_ids.max()) >= vocab_size:
                    raise Eagle3Error(
                        f"{root / SYNTHETIC_DIR}: sample {sequence.sample_id} has a token id >= the verifier's vocab "
                        f"size {vocab_size}; the tokenizer does not match the verifier"
                    )
            if sequences:
                masked += torch.bincount(torch.cat([s.input_ids[s.loss_mask] for s in sequences]), minlength=vocab_size)
                every += torch.bincount(torch.cat([s.input_ids for s in sequences]), minlength=vocab_size)
            bar.advance(task)
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
    provenance = read_provenance(root)
    vocab_size = provenance.vocab_size
    if config.draft_vocab_size > vocab_size:
        raise Eagle3Error(
            f"vocab.draft_vocab_size: {config.draft_vocab_size} exceeds the verifier's vocab size {vocab_size}"
        )
    parts = synthetic_parts(root, ["train"])
    tokenizer = load_tokenizer(root, provenance)
    masked, every = count_tokens(root, parts, tokenizer, params.extract.max_seq_len, vocab_size)
    total = int(masked.sum())
    if total == 0:
        raise Eagle3Error(f"{root / SYNTHETIC_DIR}: the training split holds no loss-masked tokens; check generate")
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
    status(
        f"vocab: {config.draft_vocab_size} draft tokens cover {metrics['coverage']:.2%} of {total} loss tokens "
        f"({distinct} distinct in the answers)"
    )
