"""Stage `generate`: the verifier regenerates every assistant turn of the prepared prompts.

Work is cut into parts of `chunk_size` prepared rows (see eagle3/synthetic.py).
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

import hashlib
import json
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from eagle3.errors import Eagle3Error
from eagle3.files import measured_run, resume_or_reset, write_json
from eagle3.hashing import sha256_file
from eagle3.layout import METRICS_DIR, PREPARED_DIR, SYNTHETIC_DIR, read_provenance, verifier_dir
from eagle3.params.generate import GenerateParams
from eagle3.progress import progress, step
from eagle3.reasoning import reasoning_format
from eagle3.synthetic import FORMAT_VERSION, finished_parts, part_path, read_part, write_part

METRICS = METRICS_DIR / "generate.json"
# Execution-only settings: changing them must resume, not restart.
_EXECUTION_ONLY = {"vllm": {"tensor_parallel_size", "gpu_memory_utilization", "cpu_kvcache_space_gib"},
                   "openai": {"base_urls", "concurrency", "timeout_s", "max_retries", "backoff_s", "max_backoff_s", "api_key_env"},
                   "transformers": {"batch_size"}}


@dataclass
class TurnRequest:
    messages: list[dict[str, Any]]
    seed: int


@dataclass
class TurnResult:
    content: str
    reasoning: str | None
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int


@dataclass
class Skip:
    """A sample the verifier cannot answer (e.g. prompt longer than its context): counted, never retried."""

    reason: str


class Conversation:
    """One prepared row being regenerated turn by turn."""

    def __init__(self, row: dict[str, Any], turns: str, sampling_seed: int):
        self.row = row
        self.sampling_seed = sampling_seed
        messages = row["messages"]
        if turns == "all":
            prompt_side = [m for m in messages if m["role"] != "assistant"]
            first_user = next(i for i, m in enumerate(prompt_side) if m["role"] == "user")
            self.messages = prompt_side[: first_user + 1]
            self.upcoming_users = prompt_side[first_user + 1 :]
        else:
            last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
            self.messages = list(messages[: last_user + 1])
            self.upcoming_users = []
        self.turns: list[dict[str, Any]] = []
        self.skip_reason: str | None = None
        self.truncated_reason: str | None = None

    @property
    def needs_turn(self) -> bool:
        return self.skip_reason is None and self.messages[-1]["role"] == "user"

    def request(self) -> TurnRequest:
        key = f"{self.sampling_seed}:{self.row['id']}:{len(self.turns)}".encode()
        return TurnRequest(messages=self.messages, seed=int(hashlib.sha256(key).hexdigest()[:8], 16) & 0x7FFFFFFF)

    def accept(self, result: TurnResult | Skip) -> None:
        if isinstance(result, Skip):
            if self.turns:
                # Earlier turns are good data: keep them, end the conversation before the turn that cannot fit.
                self.messages = self.messages[:-1]
                self.upcoming_users = []
                self.truncated_reason = result.reason
            else:
                self.skip_reason = result.reason
            return
        self.messages = [*self.messages, {"role": "assistant", "content": result.content, "reasoning": result.reasoning}]
        self.turns.append(
            {
                "finish_reason": result.finish_reason,
                "prompt_tokens": result.prompt_tokens,
                "completion_tokens": result.completion_tokens,
                "reasoning_format": reasoning_format(result.content, result.reasoning),
            }
        )
        if self.upcoming_users:
            self.messages.append(self.upcoming_users.pop(0))

    def record(self, common: dict[str, Any]) -> dict[str, Any]:
        return {
            **{key: self.row[key] for key in ("id", "source", "origin", "prompt_hash")},
            "status": "skipped" if self.skip_reason else "ok",
            "skip_reason": self.skip_reason,
            "truncated_reason": self.truncated_reason,
            "messages": self.messages if not self.skip_reason else self.row["messages"],
            "turns": self.turns,
            **common,
        }


@dataclass
class Chunk:
    split: str
    index: int
    conversations: list[Conversation]


def drive_batched(chunks: Iterable[Chunk], generate: Callable[[list[TurnRequest]], list[TurnResult | Skip]],
                  on_done: Callable[[Chunk], None]) -> None:
    """For batch engines: each part is one batch, turn by turn, so its output never depends on other parts."""
    for chunk in chunks:
        while pending := [c for c in chunk.conversations if c.needs_turn]:
            for conversation, result in zip(pending, generate([c.request() for c in pending]), strict=True):
                conversation.accept(result)
        on_done(chunk)


def run(params, root: Path, options=None) -> None:
    config: GenerateParams = params.generate
    rank, world_size = (options.rank, options.world_size) if options is not None else (0, 1)
    if not 0 <= rank < world_size:
        raise Eagle3Error(f"--rank {rank} must be in [0, --world-size {world_size})")
    provenance = read_provenance(root)
    rows = {split: _prepared_rows(root, split) for split in config.splits}
    out = root / SYNTHETIC_DIR
    key, settings = _run_key(config, provenance, root)
    if not resume_or_reset(out, key, settings):
        step("generate: no finished parts made with these settings; starting fresh")

    total_parts = {split: -(-len(split_rows) // config.chunk_size) for split, split_rows in rows.items()}
    finished = {split: finished_parts(out / split) for split in config.splits}
    todo = [
        (split, index)
        for split in config.splits
        for index in range(total_parts[split])
        if index % world_size == rank and index not in finished[split]
    ]
    done_before = sum(map(len, finished.values()))

    def part_rows(split: str, index: int) -> list[dict[str, Any]]:
        return rows[split][index * config.chunk_size : (index + 1) * config.chunk_size]
    common = {"sampling": config.sampling.model_dump(), "verifier": provenance["name"], "backend": config.backend}
    stats = Counter()
    elapsed = 0.0
    if todo:
        step(f"generate: {len(todo)} parts to make with the {config.backend} backend ({done_before} already done)")
        backend = _backend(config, provenance, root)
        started = time.monotonic()

        def chunks() -> Iterable[Chunk]:
            for split, index in todo:
                yield Chunk(split, index, [Conversation(row, config.turns, config.sampling.seed) for row in part_rows(split, index)])

        with progress() as bar:
            task = bar.add_task("generate", total=sum(len(part_rows(s, i)) for s, i in todo))

            def on_done(chunk: Chunk) -> None:
                records = [conversation.record(common) for conversation in chunk.conversations]
                (out / chunk.split).mkdir(parents=True, exist_ok=True)
                write_part(part_path(out / chunk.split, chunk.index), records)
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

    missing = {s: total_parts[s] - len(finished_parts(out / s)) for s in config.splits}
    if any(missing.values()):
        step(f"rank {rank}/{world_size} done; parts still missing (other ranks): {missing}")
        return
    _write_manifest(out, config.splits)
    _write_metrics(root, out, config, stats, elapsed)


def _prepared_rows(root: Path, split: str) -> list[dict[str, Any]]:
    path = root / PREPARED_DIR / f"{split}.parquet"
    if not path.is_file():
        raise Eagle3Error(f"{path}: missing; run `dvc repro prepare` first")
    return pq.read_table(path).to_pylist()


def _run_key(config: GenerateParams, provenance: dict[str, Any], root: Path) -> tuple[str, dict[str, Any]]:
    generation = config.model_dump(mode="json")
    for section, keys in _EXECUTION_ONLY.items():
        if isinstance(generation.get(section), dict):
            generation[section] = {k: v for k, v in generation[section].items() if k not in keys}
    card = json.loads((root / PREPARED_DIR / "card.json").read_text(encoding="utf-8"))
    settings = {
        "format_version": FORMAT_VERSION,
        "generate": generation,
        "verifier": {k: provenance[k] for k in ("name", "config_sha256", "tokenizer_sha256", "chat_template_sha256")},
        "prepared": {s: card["files"][f"{s}.parquet"]["content_sha256"] for s in config.splits},
    }
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest(), settings


def _write_manifest(out: Path, splits: list[str]) -> None:
    manifest = {}
    for split in splits:
        parts = finished_parts(out / split)
        manifest[split] = [
            {"part": path.name, "sha256": sha256_file(path), "records": len(read_part(path))}
            for path in (parts[i] for i in sorted(parts))
        ]
    write_json(out / "manifest.json", manifest)


def _write_metrics(root: Path, out: Path, config: GenerateParams, stats: Counter, elapsed: float) -> None:
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
        **dict(totals),
        "skipped": dict(sorted(skipped.items())),
        "truncated_conversations": dict(sorted(truncated.items())),
        "finish_reasons": dict(sorted(finish.items())),
        "turns_with_reasoning": dict(sorted(reasoning.items())),
        # A rerun that found every part finished measured nothing: it reports the run that did the work.
        "this_run": measured_run(root, "generate", {
            "samples": stats["samples"],
            "completion_tokens": stats["completion_tokens"],
            "generation_seconds": round(elapsed, 2),
            "completion_tokens_per_s": round(stats["completion_tokens"] / elapsed, 1) if elapsed > 0 and stats["samples"] else None,
        }, bool(stats["samples"])),
    }
    write_json(root / METRICS, metrics)
    step(
        f"generated {totals['ok']} conversations ({totals['completion_tokens']} completion tokens), "
        f"skipped {dict(skipped) or 0}; this run: {metrics['this_run']['completion_tokens_per_s']} tok/s -> {SYNTHETIC_DIR}"
    )


def _backend(config: GenerateParams, provenance: dict[str, Any], root: Path):
    if config.backend == "vllm":
        from eagle3.backends.vllm_offline import VllmBackend

        return VllmBackend(config, verifier_dir(root), provenance)
    if config.backend == "openai":
        from eagle3.backends.openai_servers import OpenAIBackend

        return OpenAIBackend(config)
    from eagle3.backends.hf_transformers import TransformersBackend

    return TransformersBackend(config, verifier_dir(root), provenance)
