"""The vocab stage's count of the training tokens: the token-id and loss-mask sections of extract's training shards
(the previous implementation, the baseline) vs laying the synthetic data out again (eagle3/stages/vocab.py:
count_tokens), which needs no stored states and so also works when training streams them.

Both arms count the same tokens in one process, alternating over rounds; the counts must be identical (the layout
is the shards' own), and the ratio is baseline time / new time. Needs a project whose `extract` stage has stored
the training split (default: this directory).

    python benchmarks/vocab.py [--root .] [--rounds 3]
"""

import argparse
import time
from pathlib import Path

import torch

from eagle3.chat.sequence_plan import load_tokenizer, synthetic_parts
from eagle3.config import load_params
from eagle3.formats.provenance import read_provenance
from eagle3.formats.shards import ShardReader, split_shards
from eagle3.stages.vocab import count_tokens


def count_from_shards(paths: list[Path], vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    masked = torch.zeros(vocab_size, dtype=torch.int64)
    every = torch.zeros(vocab_size, dtype=torch.int64)
    for path in paths:
        reader = ShardReader(path, vocab_size)
        answers, tokens = [], []
        for position in range(len(reader)):
            input_ids, loss_mask = reader.read_tokens(position)
            answers.append(input_ids[loss_mask])
            tokens.append(input_ids)
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
