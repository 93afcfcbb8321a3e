"""Extract's shard writing beside the engine (a writing thread, eagle3/stages/extract.py `write_shards`) against
writing in the engine's loop (what the stage did before: each sample compressed and written between forward
passes), same samples, same ShardWriter, one process.

    python benchmarks/extract_overlap.py [--samples 48] [--tokens 2048] [--hidden 2048] [--engine-ms-per-k 40]

The engine is a stand-in for a GPU: each forward pass sleeps in proportion to its tokens (`--engine-ms-per-k`
milliseconds per 1,000 tokens; the GIL is free meanwhile, as it is while CUDA kernels run) and returns fixed
random bf16 states of 4 captured layers x `--hidden`. Prints, per arm, the wall time, the engine's busy time and
the share of the wall time the engine sat waiting for the writer, then the ratio; checks both arms wrote the same
bytes.
"""

import argparse
import hashlib
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eagle3.chat.sequence_plan import Part  # noqa: E402
from eagle3.chat.token_layout import Sequence  # noqa: E402
from eagle3.engines.hidden_states.batching import in_plan_order, part_batches  # noqa: E402
from eagle3.environment import EnvironmentLog  # noqa: E402
from eagle3.formats.shards import ShardMeta, ShardWriter  # noqa: E402
from eagle3.params.extract import ExtractParams  # noqa: E402
from eagle3.stages.extract import PartPlan, ShardPlan, ShardSink, write_shards  # noqa: E402

LAYERS = (2, 15, 27, 30)


class SleepingEngine:
    """A GPU stand-in: busy for a time proportional to the batch's tokens, with the GIL free."""

    pads_batches = False

    def __init__(self, hidden: int, ms_per_k: float):
        self.hidden, self.ms_per_k, self.busy = hidden, ms_per_k, 0.0
        self.cache: dict[int, torch.Tensor] = {}

    def forward(self, batch: list[Sequence]) -> list[torch.Tensor]:
        seconds = self.ms_per_k * sum(len(s.input_ids) for s in batch) / 1e6
        time.sleep(seconds)
        self.busy += seconds
        return [self._states(len(s.input_ids)) for s in batch]

    def _states(self, tokens: int) -> torch.Tensor:
        if tokens not in self.cache:  # random, so zstd has real work; made once, outside the measured engine time
            generator = torch.Generator().manual_seed(tokens)
            self.cache[tokens] = torch.randn(len(LAYERS), tokens, self.hidden, generator=generator).to(torch.bfloat16)
        return self.cache[tokens]


def in_the_loop(backend, out: Path, plan: PartPlan, meta: ShardMeta, config: ExtractParams) -> None:
    """What the stage did before write_shards: every sample compressed and written before the next forward pass may
    start."""
    sequences = [sequence for shard in plan.shards for sequence in shard.sequences]
    owner = [shard for shard in plan.shards for _ in shard.sequences]
    batches = part_batches([shard.sequences for shard in plan.shards], config.batch_tokens, backend.pads_batches)
    (out / plan.part.split).mkdir(parents=True, exist_ok=True)
    writer = None
    for position, hidden in in_plan_order(backend, sequences, batches, list(range(len(sequences)))):
        shard, sequence = owner[position], sequences[position]
        if writer is None:
            path = out / shard.split / shard.path_name
            writer = ShardWriter(path, meta, config.compression_level, config.compression_threads)
        writer.add(sequence.sample_id, sequence.input_ids, sequence.loss_mask, hidden)
        if sequence is shard.sequences[-1]:
            writer.close()
            writer = None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--tokens", type=int, default=2048, help="tokens per sample")
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--engine-ms-per-k", type=float, default=40.0)
    parser.add_argument("--threads", type=int, default=2, help="extract.compression_threads")
    args = parser.parse_args()
    config = ExtractParams(
        batch_tokens=4 * args.tokens, shard_raw_mb=64, compression_threads=args.threads, max_seq_len=args.tokens
    )
    meta = ShardMeta("stand-in", LAYERS, args.hidden, "0" * 64)
    sequences = [
        Sequence(f"s{n}", torch.randint(0, 1000, (args.tokens,)), torch.ones(args.tokens, dtype=torch.bool), False)
        for n in range(args.samples)
    ]
    per_shard = max(1, config.shard_raw_mb * 2**20 // (args.tokens * len(LAYERS) * args.hidden * 2))
    part = Part("train", 0, Path("part-00000.jsonl"))
    shards = [
        ShardPlan("train", 0, number, sequences[first : first + per_shard])
        for number, first in enumerate(range(0, len(sequences), per_shard))
    ]
    plan = PartPlan(part, shards, Counter())
    arms = {
        "in the loop": lambda backend, out: in_the_loop(backend, out, plan, meta, config),
        "beside": lambda backend, out: write_shards(
            backend, ShardSink(out, meta, config, EnvironmentLog(out, {})), plan, shards
        ),
    }
    results, digests = {}, {}
    warm = SleepingEngine(args.hidden, 0.0)
    for sequence in sequences[:1]:
        warm.forward([sequence])
    for label, run in arms.items():
        backend = SleepingEngine(args.hidden, args.engine_ms_per_k)
        backend.cache = warm.cache
        with tempfile.TemporaryDirectory() as scratch:
            started = time.perf_counter()
            run(backend, Path(scratch))
            seconds = time.perf_counter() - started
            digests[label] = {
                p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(scratch).rglob("*.e3sh"))
            }
        waiting = 1 - backend.busy / seconds
        results[label] = (seconds, waiting)
        print(
            f"{label:12s} {seconds:6.2f} s wall, engine busy {backend.busy:6.2f} s, engine waiting "
            f"{100 * waiting:5.1f}% of the time",
            flush=True,
        )
    assert digests["in the loop"] == digests["beside"] and digests["beside"], "both arms must write the same shards"
    (before, waited_before), (after, waited_after) = results.values()
    print(
        f"\nbeside / in the loop: wall time x{after / before:.2f}, engine waiting {100 * waited_before:.0f}% -> "
        f"{100 * waited_after:.0f}% ({args.samples} samples of {args.tokens} tokens, 4 x {args.hidden} states, "
        f"{args.threads} compression threads, engine {args.engine_ms_per_k:g} ms per 1,000 tokens)"
    )


if __name__ == "__main__":
    main()
