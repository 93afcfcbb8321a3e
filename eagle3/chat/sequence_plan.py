"""The training sequences of the synthetic data, in the order everything downstream sees them.

A split's sequences are its synthetic parts in manifest order, each part's records in prepared order, each record
laid out by eagle3/chat/token_layout.py (a long conversation may give several sequences) and kept when it has a
loss token. extract stores them in this order (its shards cut this stream), vocab counts them and a streamed
training run (train.hidden_states `streamed`) computes their states in it, so all three agree on what a global
sequence position is.
"""

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3.background import one_ahead
from eagle3.chat.token_layout import Sequence, layout
from eagle3.errors import Eagle3Error
from eagle3.formats.provenance import Provenance, verifier_dir
from eagle3.formats.synthetic import PART_PATTERN, SyntheticRecord, read_manifest, read_part
from eagle3.paths import SYNTHETIC_DIR, SYNTHETIC_MANIFEST

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class Part:
    """One synthetic part: the unit of planning, resume and scale-out."""

    split: str
    index: int
    path: Path


def synthetic_parts(root: Path, splits: Iterable[str]) -> list[Part]:
    """The parts of `splits` as generate's manifest lists them."""
    manifest = read_manifest(root / SYNTHETIC_MANIFEST)
    return [
        Part(split, _part_index(entry["part"]), root / SYNTHETIC_DIR / split / entry["part"])
        for split in splits
        for entry in manifest.get(split, [])
    ]


def _part_index(name: str) -> int:
    match = PART_PATTERN.match(name)
    if match is None:  # read_manifest checks every name against the pattern
        raise Eagle3Error(f"{SYNTHETIC_MANIFEST}: {name!r} is not a part file name")
    return int(match[1])


def load_tokenizer(root: Path, provenance: Provenance) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(verifier_dir(root), trust_remote_code=provenance.trust_remote_code)


def part_sequences(
    records: Iterable[SyntheticRecord], tokenizer: "PreTrainedTokenizerBase", max_seq_len: int, counts: Counter
) -> Iterator[Sequence]:
    """A part's training sequences in order; `counts` gets what was skipped or truncated, and why."""
    for record in records:
        if record["status"] != "ok":
            counts[f"skipped_{record['skip_reason']}"] += 1
            continue
        made = layout(
            tokenizer,
            record["id"],
            record["messages"],
            max_seq_len,
            record["chat_template_kwargs"],
            record["turns"],
        )
        if not made:
            counts["skipped_empty_conversation"] += 1
        for sequence in made:
            counts["truncated"] += sequence.truncated
            if not sequence.loss_mask.any():
                counts["skipped_no_loss_tokens_after_truncation"] += 1
                continue
            yield sequence


def split_sequences(
    parts: list[Part], tokenizer: "PreTrainedTokenizerBase", max_seq_len: int
) -> Iterator[list[Sequence]]:
    """Each part's sequences, a part at a time, laid out one part ahead of the consumer."""
    return one_ahead(list(part_sequences(read_part(part.path), tokenizer, max_seq_len, Counter())) for part in parts)
