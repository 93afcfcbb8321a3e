"""Generation throughput: the `vllm` backend vs HF `generate`, same prompts, same greedy settings, one process.

    python benchmarks/generate.py [--prompts 32] [--max-tokens 48]

Needs models/verifier (`dvc repro verifier`). Prints completion tokens/s for
  - vllm:          eagle3's vLLM backend (one batch per part, as the stage runs it)
  - hf-batched:    eagle3's transformers fallback (left-padded batches of 8)
  - hf-per-prompt: a plain loop of model.generate, one prompt at a time (what a quick script does)
and the ratios against the vLLM backend. Engine/model start-up is timed separately, not counted in tok/s.
"""

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eagle3.engines.generation.base import TurnRequest, TurnResult  # noqa: E402
from eagle3.formats.provenance import read_provenance, verifier_dir  # noqa: E402
from eagle3.params.generate import GenerateParams  # noqa: E402
from eagle3.precision import engine_device_type, resolve  # noqa: E402


def prompts(count: int) -> list[list[dict]]:
    rows = [json.loads(line) for line in (ROOT / "data/prompts/eagle3-prompts.jsonl").read_text().splitlines()]
    step = len(rows) // count
    return [[{"role": "user", "content": rows[i * step]["conversations"][0]["value"]}] for i in range(count)]


def timed(label: str, make, run) -> tuple[float, int]:
    start = time.perf_counter()
    backend = make()
    startup = time.perf_counter() - start
    start = time.perf_counter()
    tokens = run(backend)
    seconds = time.perf_counter() - start
    print(
        f"{label:14s} start-up {startup:6.1f} s   {tokens:6d} tokens in {seconds:6.1f} s = {tokens / seconds:7.1f} "
        "tok/s",
        flush=True,
    )
    return tokens / seconds, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()

    provenance, model_dir = read_provenance(ROOT), verifier_dir(ROOT)
    config = GenerateParams(
        chunk_size=args.prompts,
        sampling={"temperature": 0.0, "max_tokens": args.max_tokens},
        vllm={"max_model_len": 1024, "gpu_memory_utilization": 0.3, "cpu_kvcache_space_gib": 2, "enforce_eager": True},
        transformers={"batch_size": 8},
    )
    requests = [TurnRequest(messages=m, seed=0) for m in prompts(args.prompts)]

    def completion_tokens(results: list) -> int:
        return sum(r.completion_tokens for r in results if isinstance(r, TurnResult))

    from eagle3.engines.generation.vllm_offline import VllmBackend

    vllm_rate, _ = timed(
        "vllm",
        lambda: VllmBackend(config, model_dir, provenance, resolve(config.dtype, engine_device_type())),
        lambda b: completion_tokens(b.generate(requests)),
    )

    from eagle3.engines.generation.hf_transformers import TransformersBackend

    batched_rate, _ = timed(
        "hf-batched",
        lambda: TransformersBackend(config, model_dir, provenance, resolve(config.dtype, "cpu")),
        lambda b: completion_tokens(b.generate(requests)),
    )

    def per_prompt(backend) -> int:
        return sum(completion_tokens(backend.generate([request])) for request in requests)

    single_rate, _ = timed(
        "hf-per-prompt",
        lambda: TransformersBackend(config, model_dir, provenance, resolve(config.dtype, "cpu")),
        per_prompt,
    )

    print(
        f"\nvllm / hf-per-prompt = {vllm_rate / single_rate:.1f}x   vllm / hf-batched = {vllm_rate / batched_rate:.1f}x"
    )


if __name__ == "__main__":
    main()
