"""Extract's streaming path (each part planned by a background thread one part ahead of the forward passes) beside
planning every part before the first forward pass (what the stage did before), same parts, same backend, one
process.

    python benchmarks/extract_streaming.py [--parts 2] [--split train] [--root PROJECT]

Needs models/verifier and data/synthetic in the project (default: this repository); takes the split's first
--parts synthetic parts and params.yaml's extract settings, writes shards to scratch directories. Prints, per path:
seconds to the first forward pass, total seconds, tokens/s, and the planner's peak Python memory (tracemalloc),
then the ratios; checks both paths wrote the same bytes.
"""

import argparse
import hashlib
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eagle3.engines.hidden_states.hf_capture import HfHiddenStates  # noqa: E402
from eagle3.environment import EnvironmentLog  # noqa: E402
from eagle3.files import read_json  # noqa: E402
from eagle3.formats.provenance import read_provenance, verifier_dir  # noqa: E402
from eagle3.formats.synthetic import read_part  # noqa: E402
from eagle3.params.params_file import load_params  # noqa: E402
from eagle3.paths import SYNTHETIC_MANIFEST  # noqa: E402
from eagle3.precision import engine_device_type, resolve  # noqa: E402
from eagle3.stages.extract import (  # noqa: E402
    ShardSink,
    plan_part,
    planned_parts,
    shard_meta,
    synthetic_parts,
    write_shards,
)


class FirstForward:
    """The backend, noting when its first forward pass starts."""

    def __init__(self, backend):
        self.backend, self.first = backend, None
        self.pads_batches = backend.pads_batches

    def forward(self, batch):
        self.first = self.first or time.perf_counter()
        return self.backend.forward(batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", type=int, default=2)
    parser.add_argument("--split", default="train")
    parser.add_argument("--root", type=Path, default=ROOT, help="project directory (default: this repository)")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    config = load_params(args.root / "params.yaml").extract
    provenance = read_provenance(args.root)
    tokenizer = AutoTokenizer.from_pretrained(verifier_dir(args.root))
    meta = shard_meta(config, provenance)
    manifest = read_json(args.root / SYNTHETIC_MANIFEST, "run `dvc repro generate` first")
    parts = synthetic_parts(args.root, [args.split], manifest)[: args.parts]
    dtype = resolve(config.dtype, engine_device_type())
    backend = HfHiddenStates(verifier_dir(args.root), provenance.trust_remote_code, meta.layer_ids, dtype)
    warm = plan_part(parts[0], read_part(parts[0].path)[:2], tokenizer, config, meta)
    backend.forward(warm.shards[0].sequences)  # first-call allocations and kernel selection are not measured

    def plan_first(timed: FirstForward, sink: ShardSink) -> None:
        plans = [plan_part(part, read_part(part.path), tokenizer, config, meta) for part in parts]
        for plan in plans:
            write_shards(timed, sink, plan, plan.shards)

    def streaming(timed: FirstForward, sink: ShardSink) -> None:
        for plan in planned_parts(parts, tokenizer, config, meta):
            write_shards(timed, sink, plan, plan.shards)

    results, digests = {}, {}
    for label, run in (("plan first", plan_first), ("streaming", streaming)):
        with tempfile.TemporaryDirectory(dir=args.root / "data") as scratch:
            timed = FirstForward(backend)
            sink = ShardSink(Path(scratch), meta, config, EnvironmentLog(Path(scratch), {}))
            extracted = sink.extracted
            tracemalloc.start()
            start = time.perf_counter()
            run(timed, sink)
            seconds = time.perf_counter() - start
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            digests[label] = {
                p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(scratch).rglob("*.e3sh"))
            }
        results[label] = (timed.first - start, seconds, extracted.tokens / seconds, peak)
        print(
            f"{label:10s} first forward after {timed.first - start:6.2f} s, {extracted.tokens} tokens in "
            f"{seconds:6.1f} s = {extracted.tokens / seconds:7.0f} tok/s, planner peak {peak / 2**20:6.1f} MiB",
            flush=True,
        )
    assert digests["plan first"] == digests["streaming"], "both paths must write the same shards"
    (first_a, total_a, rate_a, peak_a), (first_b, total_b, rate_b, peak_b) = results.values()
    print(
        f"\nstreaming / plan first: tokens/s x{rate_b / rate_a:.2f}, first forward pass x{first_a / first_b:.1f} "
        f"sooner, Python peak memory x{peak_b / peak_a:.2f}"
    )


if __name__ == "__main__":
    main()
