"""Stage `generate`: the verifier regenerates every assistant turn of the prepared prompts.

Work is cut into parts of `chunk_size` prepared rows (format: eagle3/formats/synthetic.py).
A part is written only when all its samples are finished, so a run killed at
any moment (SIGKILL included) loses at most the parts in flight, and a rerun
regenerates exactly the missing parts. Each part is generated as one batch in
the batch backends, so a resumed run computes every part exactly as an
uninterrupted run does (identical output at temperature 0).

`run.json` pins what the parts were made with (verifier, prepared data,
sampling, backend, chunking): parts made with other settings are discarded,
never mixed in. Execution-only settings (server URLs, concurrency, retries,
tensor parallelism) are not part of it, so changing them resumes.

Scale-out: `eagle3 generate --rank R --world-size W` makes the parts whose
index % W == R. Ranks can share one directory or run on separate machines;
copying every rank's parts into one data/synthetic/ and running the stage
once more (or `dvc repro`) finds nothing missing and writes the manifest.
"""

import argparse
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from eagle3.engines.generation.base import Chunk, Conversation, GenerationBackend
from eagle3.environment import EnvironmentLog, capture, fingerprint
from eagle3.errors import Eagle3Error
from eagle3.files import write_json
from eagle3.formats.prepared import content_sha256, read_rows
from eagle3.formats.provenance import (
    TEXT_IDENTITY,
    Provenance,
    checked_verifier_dir,
    read_provenance,
    verifier_dir,
)
from eagle3.formats.synthetic import FORMAT_VERSION, finished_parts, part_path, read_part, write_manifest, write_part
from eagle3.params.base import StageParams, pinned_settings
from eagle3.params.generate import GenerateParams
from eagle3.paths import GENERATE_METRICS, SYNTHETIC_DIR
from eagle3.precision import engine_device_type, resolve
from eagle3.progress import progress, status
from eagle3.resume import measured_run, resume_or_reset
from eagle3.scale_out import Slice
from eagle3.scale_out import add_arguments as add_arguments  # the runner gives this stage --rank / --world-size

# Runs on the GPUs where there are any: refused where nvidia-smi lists GPUs that torch cannot see (eagle3/runner.py).
USES_GPUS = True


class Params(StageParams):
    generate: GenerateParams


def run(params: Params, root: Path, options: argparse.Namespace | None = None) -> None:
    config = params.generate
    ranks = Slice.from_options(options)
    provenance = read_provenance(root)
    rows: dict[str, list[dict[str, Any]]] = {split: read_rows(root, split) for split in config.splits}
    out = root / SYNTHETIC_DIR
    tensor_parallel = config.vllm.tensor_parallel_size if config.backend == "vllm" else None
    dtype = compute_dtype(config)
    environment = ranks.environment(tensor_parallel_size=tensor_parallel, compute_dtype=dtype)
    if not resume_or_reset(out, run_settings(config, provenance, root, environment)).kept:
        status("generate: no finished parts made with these settings; starting fresh")

    total_parts = {split: -(-len(split_rows) // config.chunk_size) for split, split_rows in rows.items()}
    finished = {split: finished_parts(out / split) for split in config.splits}
    todo = [
        (split, index)
        for split in config.splits
        for index in range(total_parts[split])
        if ranks.owns(index) and index not in finished[split]
    ]
    done_before = sum(map(len, finished.values()))

    def part_rows(split: str, index: int) -> list[dict[str, Any]]:
        return rows[split][index * config.chunk_size : (index + 1) * config.chunk_size]

    common = {
        "sampling": config.sampling.model_dump(),
        "chat_template_kwargs": config.chat_template_kwargs,
        "verifier": provenance.name,
        "backend": config.backend,
    }
    stats: Counter[str] = Counter()
    elapsed = 0.0
    if todo:
        status(f"generate: {len(todo)} parts to make with the {config.backend} backend ({done_before} already done)")
        backend = _backend(config, provenance, root, dtype)
        # Captured again once the engine has set its switches; what made the parts, with the backend's own facts.
        log = EnvironmentLog(
            out,
            {**ranks.environment(tensor_parallel_size=tensor_parallel, compute_dtype=dtype), **backend.environment()},
            ranks.rank,
        )
        started = time.monotonic()

        def chunks() -> Iterable[Chunk]:
            for split, index in todo:
                yield Chunk(
                    split,
                    index,
                    [Conversation(row, config.turns, config.sampling.seed) for row in part_rows(split, index)],
                )

        with progress() as bar:
            task = bar.add_task("generate", total=sum(len(part_rows(s, i)) for s, i in todo))

            def on_done(chunk: Chunk) -> None:
                records = [conversation.record(common) for conversation in chunk.conversations]
                (out / chunk.split).mkdir(parents=True, exist_ok=True)
                path = part_path(out / chunk.split, chunk.index)
                write_part(path, records)
                log.made(f"{chunk.split}/{path.name}")
                stats["samples"] += len(records)
                stats["completion_tokens"] += sum(t["completion_tokens"] for r in records for t in r["turns"])
                bar.advance(task, len(records))

            try:
                backend.process(chunks(), on_done)
            except Eagle3Error as exc:
                parts = {split: finished_parts(out / split) for split in config.splits}
                samples = sum(len(part_rows(s, i)) for s in parts for i in parts[s])
                raise Eagle3Error(
                    f"{exc}; {sum(map(len, parts.values()))}/{sum(total_parts.values())} parts "
                    f"({samples}/{sum(map(len, rows.values()))} samples) are finished and kept, rerun to continue"
                ) from None
            finally:
                elapsed = time.monotonic() - started
                backend.close()

    missing = [
        f"{split}/{part_path(out / split, index).name}"
        for split in config.splits
        for index in sorted(set(range(total_parts[split])) - set(finished_parts(out / split)))
    ]
    if not ranks.finished_unless_missing("generate", missing):
        return
    write_manifest(out, config.splits)
    _write_metrics(root, out, config, dtype, stats, elapsed)


def compute_dtype(config: GenerateParams) -> str | None:
    """generate.dtype resolved for the device its backend computes on (vLLM: the GPUs when there are any; the
    transformers fallback: the CPU); None for servers, which compute in their own."""
    if config.backend == "openai":
        return None
    return resolve(config.dtype, engine_device_type() if config.backend == "vllm" else "cpu")


def run_settings(
    config: GenerateParams, provenance: Provenance, root: Path, environment: dict[str, Any] | None = None
) -> dict[str, Any]:
    """What the parts are made from (the run key's input): params without execution-only settings, the compute
    dtype they resolve to here, the verifier's identity, the prepared rows' hashes, the part format; with
    `pin_environment`, the environment."""
    settings = {
        "format_version": FORMAT_VERSION,
        "generate": pinned_settings(config),
        "compute_dtype": compute_dtype(config),
        "verifier": {**provenance.identity(*TEXT_IDENTITY), **provenance.weights_identity()},
        "prepared": {split: content_sha256(root, split) for split in config.splits},
    }
    if config.pin_environment:
        settings["environment"] = fingerprint(environment or capture())
    return settings


def _write_metrics(
    root: Path, out: Path, config: GenerateParams, dtype: str | None, stats: Counter, elapsed: float
) -> None:
    totals: Counter = Counter()
    skipped: Counter = Counter()
    finish: Counter = Counter()
    reasoning: Counter = Counter()
    truncated: Counter = Counter()
    for split in config.splits:
        parts = finished_parts(out / split)
        for index in sorted(parts):
            for record in read_part(parts[index]):
                totals["samples"] += 1
                if record["status"] == "skipped":
                    skipped[record["skip_reason"]] += 1
                    continue
                totals["ok"] += 1
                if record["truncated_reason"]:
                    truncated[record["truncated_reason"]] += 1
                for turn in record["turns"]:
                    totals["assistant_turns"] += 1
                    totals["prompt_tokens"] += turn["prompt_tokens"]
                    totals["completion_tokens"] += turn["completion_tokens"]
                    finish[turn["finish_reason"] or "unknown"] += 1
                    if turn["reasoning_format"]:
                        reasoning[turn["reasoning_format"]] += 1
    metrics = {
        "backend": config.backend,
        "compute_dtype": dtype or "as served",
        **dict(totals),
        "skipped": dict(sorted(skipped.items())),
        "truncated_conversations": dict(sorted(truncated.items())),
        "finish_reasons": dict(sorted(finish.items())),
        "turns_with_reasoning": dict(sorted(reasoning.items())),
        # A rerun that found every part finished measured nothing: it reports the run that did the work.
        "this_run": measured_run(
            root,
            "generate",
            {
                "samples": stats["samples"],
                "completion_tokens": stats["completion_tokens"],
                "generation_seconds": round(elapsed, 2),
                "completion_tokens_per_s": round(stats["completion_tokens"] / elapsed, 1)
                if elapsed > 0 and stats["samples"]
                else None,
            },
            bool(stats["samples"]),
        ),
    }
    write_json(root / GENERATE_METRICS, metrics)
    status(
        f"generated {totals['ok']} conversations ({totals['completion_tokens']} completion tokens), "
        f"skipped {dict(skipped) or 0}; "
        + (
            f"this run: {stats['completion_tokens'] / elapsed:.1f} tok/s"
            if stats["samples"] and elapsed > 0
            else "every part was already finished"
        )
        + f" -> {SYNTHETIC_DIR}"
    )


def _backend(config: GenerateParams, provenance: Provenance, root: Path, dtype: str | None) -> GenerationBackend:
    """`dtype`: compute_dtype's, None only for the servers (openai), which compute in their own."""
    if config.backend == "openai":
        from eagle3.chat.reasoning import template_renders_reasoning
        from eagle3.engines.generation.openai_servers import OpenAIBackend

        return OpenAIBackend(config, template_renders_reasoning(verifier_dir(root), provenance.trust_remote_code))
    if dtype is None:
        raise ValueError(f"generate.backend {config.backend} computes here: it needs a compute dtype")
    if config.backend == "vllm":
        from eagle3.engines.generation.vllm_offline import VllmBackend

        return VllmBackend(config, checked_verifier_dir(root), provenance, dtype)
    from eagle3.engines.generation.hf_transformers import TransformersBackend

    return TransformersBackend(config, checked_verifier_dir(root), provenance, dtype)
