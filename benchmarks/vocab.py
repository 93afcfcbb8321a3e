"""The vocab stage's pass over the training shards: decoding every full record (the previous implementation, the
baseline) vs reading only the token-id and loss-mask sections (eagle3/stages/vocab.py: count_tokens).

Both arms count the same tokens of the same shards in one process, alternating over rounds; the counts must be
identical, and the ratio is baseline time / new time. Needs a project whose `extract` stage has run (default: this
directory; the embedded default's 1,216 training samples, 243 MB of shards).

    python benchmarks/vocab.py [--root .] [--rounds 3]
"""

import argparse
import time
from pathlib import Path

import torch

from eagle3.formats.provenance import read_provenance
from eagle3.formats.shards import ShardReader, split_shards
from eagle3.stages.vocab import count_tokens


def count_by_full_decode(paths: list[Path], vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    masked = torch.zeros(vocab_size, dtype=torch.int64)
    every = torch.zeros(vocab_size, dtype=torch.int64)
    for path in paths:
        reader = ShardReader(path)
        for position in range(len(reader)):
            sample = reader.read(position)
            masked += torch.bincount(sample.input_ids[sample.loss_mask], minlength=vocab_size)
            every += torch.bincount(sample.input_ids, minlength=vocab_size)
        reader.close()
    return masked, every


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path("."))
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    root = args.root.resolve()
    vocab_size = read_provenance(root).vocab_size
    paths = split_shards(root, "train")
    size = sum(p.stat().st_size for p in paths)
    times: dict[str, list[float]] = {"full decode (baseline)": [], "token sections only": []}
    results = {}
    for _ in range(args.rounds):
        for name, count in (
            ("full decode (baseline)", lambda: count_by_full_decode(paths, vocab_size)),
            ("token sections only", lambda: count_tokens(root, "train", vocab_size)),
        ):
            started = time.perf_counter()
            results[name] = count()
            times[name].append(time.perf_counter() - started)
    baseline, new = results.values()
    identical = all(torch.equal(a, b) for a, b in zip(baseline, new, strict=True))
    print(f"{len(paths)} shards, {size / 1e6:,.0f} MB, {int(new[1].sum()):,} tokens; counts identical: {identical}")
    best = {name: min(values) for name, values in times.items()}
    for name, seconds in best.items():
        ratio = best["full decode (baseline)"] / seconds
        print(f"{name:24s} {seconds:7.2f} s (best of {args.rounds})  {size / 1e6 / seconds:8,.0f} MB/s  x{ratio:.2f}")
    if not identical:
        raise SystemExit("the two arms counted different tokens")


if __name__ == "__main__":
    main()
