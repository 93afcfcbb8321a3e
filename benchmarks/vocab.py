"""The vocab stage's count of the training tokens: the token-id and loss-mask sections of extract's training shards
(the previous implementation, the baseline) vs laying the synthetic data out again (eagle3/stages/vocab.py:
count_tokens), which needs no stored states and so also works when training streams them.

Both arms count the same tokens in one process, alternating over rounds; the counts must be identical (the layout
is the shards' own), and the ratio is baseline time / new time. Needs a project whose `extract` stage has stored
the training split (default: this directory).

    python benchmarks/vocab.py [--root .] [--rounds 3]
"""

import argparse
import mmap
import time
from pathlib import Path

import numpy as np
import torch
import xxhash
import zstandard

from eagle3.chat.sequence_plan import load_tokenizer, synthetic_parts
from eagle3.formats.provenance import read_provenance
from eagle3.formats.shard_checks import ShardError, inflated, record_sections
from eagle3.formats.shards import ShardReader, split_shards
from eagle3.params.params_file import load_params
from eagle3.stages.vocab import count_tokens


def token_sections(reader: ShardReader, mapped: memoryview, position: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The baseline's read: one record's (input ids, loss mask), its checksum and layout checked in place through
    the memory map, only its two token sections decompressed (the states never decoded)."""
    entry, where = reader.entries[position], f"{reader.path}: sample {position}"
    record = mapped[entry["offset"] : entry["offset"] + entry["length"]]
    if xxhash.xxh3_64_intdigest(record) != entry["xxh3"]:
        raise ShardError(f"{where}: checksum mismatch")
    shape = (len(reader.meta.layer_ids), entry["tokens"], reader.meta.hidden_size)
    (_, tokens, _), sections = record_sections(record, reader.meta.storage, where, shape)
    decompressor = zstandard.ZstdDecompressor()
    ids = np.frombuffer(inflated(sections[0], decompressor, where), dtype="<i4").astype(np.int64)
    mask = np.unpackbits(np.frombuffer(inflated(sections[1], decompressor, where), dtype=np.uint8), count=tokens)
    return torch.from_numpy(ids), torch.from_numpy(mask.astype(bool))


def count_from_shards(paths: list[Path], vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    masked = torch.zeros(vocab_size, dtype=torch.int64)
    every = torch.zeros(vocab_size, dtype=torch.int64)
    for path in paths:
        reader = ShardReader(path, vocab_size)
        answers, tokens = [], []
        with mmap.mmap(reader.handle.fileno(), 0, access=mmap.ACCESS_READ) as mapping:
            mapped = memoryview(mapping)
            for position in range(len(reader)):
                input_ids, loss_mask = token_sections(reader, mapped, position)
                answers.append(input_ids[loss_mask])
                tokens.append(input_ids)
            del input_ids, loss_mask
            mapped.release()
        reader.close()
        if tokens:
            masked += torch.bincount(torch.cat(answers), minlength=vocab_size)
            every += torch.bincount(torch.cat(tokens), minlength=vocab_size)
    return masked, every


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path("."))
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    root = args.root.resolve()
    provenance = read_provenance(root)
    vocab_size = provenance.vocab_size
    paths = split_shards(root, "train")
    parts, tokenizer = synthetic_parts(root, ["train"]), load_tokenizer(root, provenance)
    max_seq_len = load_params(root / "params.yaml").extract.max_seq_len
    size = sum(p.stat().st_size for p in paths)
    times: dict[str, list[float]] = {"shard token sections (baseline)": [], "synthetic data laid out": []}
    results = {}
    for _ in range(args.rounds):
        for name, count in (
            ("shard token sections (baseline)", lambda: count_from_shards(paths, vocab_size)),
            ("synthetic data laid out", lambda: count_tokens(root, parts, tokenizer, max_seq_len, vocab_size)),
        ):
            started = time.perf_counter()
            results[name] = count()
            times[name].append(time.perf_counter() - started)
    baseline, new = results.values()
    identical = all(torch.equal(a, b) for a, b in zip(baseline, new, strict=True))
    print(f"{len(paths)} shards, {size / 1e6:,.0f} MB, {int(new[1].sum()):,} tokens; counts identical: {identical}")
    best = {name: min(values) for name, values in times.items()}
    for name, seconds in best.items():
        ratio = best["shard token sections (baseline)"] / seconds
        print(f"{name:32s} {seconds:7.2f} s (best of {args.rounds})  {size / 1e6 / seconds:8,.0f} MB/s  x{ratio:.2f}")
    if not identical:
        raise SystemExit("the two arms counted different tokens")


if __name__ == "__main__":
    main()
