"""Extraction throughput: this stage's hf backend vs a naive loop, on the same real conversations, one process.

    python benchmarks/extract.py [--samples 64] [--split train] [--root PROJECT]

Needs models/verifier and data/synthetic in the project (default: this
repository). Takes the first --samples sequences the stage would extract (same
chat-template layout, params.yaml's extract settings) and times, each writing
to a scratch directory:
  - naive: one HF forward per sample + torch.save per sample file (SpecForge / ModelOpt style)
  - stage, plan-order batches: padded batches of up to extract.batch_tokens in plan order + ShardWriter
    (what the stage did before length sorting)
  - stage: length-sorted batches, states written back in plan order + ShardWriter (what `eagle3 extract` runs)
All three use the same bf16 base model (no lm_head), so the ratios measure batching and storage only.
Prints tokens/s, padding overhead and the ratios.
"""

import argparse
import sys
import tempfile
import time
from collections import Counter
from itertools import islice
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eagle3.chat.sequence_plan import part_sequences  # noqa: E402
from eagle3.engines.hidden_states.batching import cut_batches, in_plan_order, length_sorted_batches  # noqa: E402
from eagle3.engines.hidden_states.hf_capture import HfHiddenStates  # noqa: E402
from eagle3.formats.provenance import read_provenance, verifier_dir  # noqa: E402
from eagle3.formats.shards import ShardWriter  # noqa: E402
from eagle3.formats.synthetic import iter_records  # noqa: E402
from eagle3.params.params_file import load_params  # noqa: E402
from eagle3.precision import engine_device_type, resolve  # noqa: E402
from eagle3.stages.extract import shard_meta  # noqa: E402


def plan_order_batches(sequences, batch_tokens: int) -> list[list[int]]:
    """The baseline: consecutive sequences in plan order, cut at the same padded-token budget."""
    return cut_batches(sequences, list(range(len(sequences))), batch_tokens)


def padded_tokens(sequences, batches) -> int:
    return sum(len(batch) * max(len(sequences[i].input_ids) for i in batch) for batch in batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--split", default="train")
    parser.add_argument("--root", type=Path, default=ROOT, help="project directory (default: this repository)")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    config = load_params(args.root / "params.yaml").extract
    provenance = read_provenance(args.root)
    tokenizer = AutoTokenizer.from_pretrained(verifier_dir(args.root))
    sequences = list(
        islice(
            part_sequences(iter_records(args.root, args.split), tokenizer, config.max_seq_len, Counter()), args.samples
        )
    )
    if len(sequences) < args.samples:
        raise SystemExit(f"need {args.samples} sequences in data/synthetic/{args.split}; run `dvc repro generate`")
    meta = shard_meta(config, provenance)
    dtype = resolve(config.dtype, engine_device_type())
    backend = HfHiddenStates(verifier_dir(args.root), provenance.trust_remote_code, meta.layer_ids, dtype)
    tokens = sum(len(s.input_ids) for s in sequences)
    backend.forward(sequences[:2])  # first-call allocations and kernel selection are not what we measure

    def naive(folder: Path) -> None:
        for sequence in sequences:
            (hidden,) = backend.forward([sequence])
            torch.save(
                {"input_ids": sequence.input_ids, "loss_mask": sequence.loss_mask, "hidden": hidden},
                folder / f"{sequence.sample_id}.pt",
            )

    def stage(batches):
        def write(folder: Path) -> None:
            with ShardWriter(
                folder / "shard-00000.e3sh", meta, config.compression_level, config.compression_threads
            ) as writer:
                for position, hidden in in_plan_order(backend, sequences, batches, list(range(len(sequences)))):
                    sequence = sequences[position]
                    writer.add(sequence.sample_id, sequence.input_ids, sequence.loss_mask, hidden)

        return write

    plan_batches = plan_order_batches(sequences, config.batch_tokens)
    sorted_batches = length_sorted_batches(sequences, config.batch_tokens)
    runs = {
        "naive (forward + torch.save per sample)": (naive, tokens),
        "stage, plan-order batches": (stage(plan_batches), padded_tokens(sequences, plan_batches)),
        "stage, length-sorted batches": (stage(sorted_batches), padded_tokens(sequences, sorted_batches)),
    }
    print(
        f"{len(sequences)} sequences, {tokens} tokens, layers {meta.layer_ids}, batch_tokens {config.batch_tokens}, "
        f"{torch.get_num_threads()} torch threads\n"
    )
    print(f"{'method':42s} {'tok/s':>8s} {'padded/real':>12s} {'seconds':>8s}")
    rates = {}
    for name, (run, padded) in runs.items():
        with tempfile.TemporaryDirectory(dir=args.root / "data") as scratch:
            start = time.perf_counter()
            run(Path(scratch))
            seconds = time.perf_counter() - start
        rates[name] = tokens / seconds
        print(f"{name:42s} {rates[name]:8.0f} {padded / tokens:12.2f} {seconds:8.1f}")
    naive_rate, plan_rate, sorted_rate = rates.values()
    print(
        f"\nstage vs naive: {sorted_rate / naive_rate:.2f}x tokens/s; "
        f"length-sorted vs plan-order batches: {sorted_rate / plan_rate:.2f}x"
    )


if __name__ == "__main__":
    main()
