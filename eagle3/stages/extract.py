"""Stage `extract`: verifier hidden states for every regenerated conversation -> data/hidden/ shards.

Captured per token: the aux layers (vLLM ids, default (2, N//2, N-3)) and the
final layer's normed output (HF hidden_states[N]); the trainer gets the
verifier's next-token distribution as lm_head(final), so no logits are stored.
Token ids and loss mask come from eagle3/chat/token_layout.py. Backends
(eagle3/engines/hidden_states/): `hf` (transformers forward, padded batches)
and `vllm` (vLLM's extract_hidden_states method); both store the same tensors
within bf16 tolerance, in the same plan.

Shards (eagle3/formats/shards.py) are planned before any forward pass: sequences in
prepared order, a new shard whenever the raw hidden states reach
`shard_raw_mb`; within a shard, batches of up to `batch_tokens` padded
tokens of similar length, whose states are written back in plan order. The
plan and each batch depend only on the data and params, so a killed run redoes
only unfinished shards and the result is byte-identical to an uninterrupted
run.
`run.json` pins the settings the finished shards were made with.
"""

import shutil
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from eagle3.chat.token_layout import Sequence, layout
from eagle3.engines.hidden_states.base import CaptureRequest, HiddenStateCapture, open_capture
from eagle3.environment import EnvironmentLog, capture, fingerprint
from eagle3.errors import Eagle3Error
from eagle3.files import write_json
from eagle3.formats.provenance import TEXT_IDENTITY, Provenance, read_provenance, verifier_dir
from eagle3.formats.shards import VERSION, ShardMeta, ShardWriter, shard_name, write_index
from eagle3.formats.synthetic import iter_records
from eagle3.hashing import sha256_file
from eagle3.params.base import StageParams, pinned_settings
from eagle3.params.extract import ExtractParams
from eagle3.paths import EXTRACT_METRICS, HIDDEN_DIR, SYNTHETIC_MANIFEST, VLLM_SPOOL
from eagle3.progress import progress, step
from eagle3.resume import measured_run, resume_or_reset

# Planning figures for the free-space check, per extract.storage: what each achieved on real states (lossless:
# 1.48x; the fp8 ones: benchmarks/storage_8bit.py), rounded down.
EXPECTED_RATIO = {"bf16-lossless": 1.4, "fp8-aux": 1.9, "fp8": 2.2, "fp8-compact": 2.5}
# Bump when the same inputs and params give other shard bytes (2: length-sorted batches, zstd hash_log 10), so the
# run key changes and shards made by older code are discarded, never mixed with new ones.
EXTRACTION_VERSION = 2


class Params(StageParams):
    extract: ExtractParams


@dataclass
class ShardPlan:
    split: str
    index: int
    sequences: list[Sequence]

    @property
    def path_name(self) -> str:
        return shard_name(self.index)


def layer_ids(config: ExtractParams, provenance: Provenance) -> tuple[int, ...]:
    layers = provenance.num_hidden_layers
    aux = config.aux_layer_ids or provenance.default_aux_layer_ids
    if max(aux) >= layers:
        raise Eagle3Error(f"extract.aux_layer_ids: {aux} must be < {layers} (the verifier's layer count)")
    return (*aux, layers)


def run(params: Params, root: Path, options=None) -> None:
    config = params.extract
    provenance = read_provenance(root)
    manifest = root / SYNTHETIC_MANIFEST
    if not manifest.is_file():
        raise Eagle3Error(f"{manifest}: missing; run `dvc repro generate` first")
    meta = ShardMeta(
        provenance.name,
        layer_ids(config, provenance),
        provenance.hidden_size,
        provenance.tokenizer_sha256,
        storage=config.storage,
    )
    out = root / HIDDEN_DIR
    settings = {
        "shard_format": VERSION,
        "extraction": EXTRACTION_VERSION,
        "extract": pinned_settings(config),
        "layer_ids": list(meta.layer_ids),
        "verifier": provenance.identity(*TEXT_IDENTITY),
        "synthetic_manifest_sha256": sha256_file(manifest),
    }
    tensor_parallel = config.vllm.tensor_parallel_size if config.backend == "vllm" else None
    if config.pin_environment:
        settings["environment"] = fingerprint(capture(tensor_parallel_size=tensor_parallel))
    if not resume_or_reset(out, settings)[1]:
        step("extract: no finished shards made with these settings; starting fresh")

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(verifier_dir(root), trust_remote_code=provenance.trust_remote_code)
    counts: Counter = Counter()
    plans: list[ShardPlan] = []
    for split in config.splits:
        plans += _plan(split, _sequences(root, split, tokenizer, config, counts), config, meta)
    todo = [plan for plan in plans if not (out / plan.split / plan.path_name).is_file()]
    _check_disk(out, todo, meta, config)

    started, done_tokens = time.monotonic(), 0
    spool = root / VLLM_SPOOL
    shutil.rmtree(spool, ignore_errors=True)  # left by a killed vllm run; never part of the output
    if todo:
        step(
            f"extract: {len(todo)} of {len(plans)} shards to write, layers {list(meta.layer_ids)}, backend "
            f"{config.backend}"
        )
        backend = open_capture(CaptureRequest(verifier_dir(root), provenance, meta.layer_ids, config, spool))
        log = EnvironmentLog(out, {**capture(tensor_parallel_size=tensor_parallel), "backend": config.backend})
        started = time.monotonic()
        try:
            with progress() as bar:
                task = bar.add_task("extract (tokens)", total=sum(len(s.input_ids) for p in todo for s in p.sequences))
                for plan in todo:
                    (out / plan.split).mkdir(parents=True, exist_ok=True)
                    with ShardWriter(
                        out / plan.split / plan.path_name, meta, config.compression_level, config.compression_threads
                    ) as writer:
                        batches = _length_sorted_batches(plan.sequences, config.batch_tokens)
                        for sequence, hidden in in_plan_order(backend, plan.sequences, batches):
                            writer.add(sequence.sample_id, sequence.input_ids, sequence.loss_mask, hidden)
                            done_tokens += len(sequence.input_ids)
                            bar.advance(task, len(sequence.input_ids))
                    log.made(f"{plan.split}/{plan.path_name}")
        finally:
            backend.close()
            shutil.rmtree(spool, ignore_errors=True)
    elapsed = time.monotonic() - started
    _write_index_and_metrics(root, out, plans, meta, counts, done_tokens, elapsed)


def _sequences(root: Path, split: str, tokenizer: Any, config: ExtractParams, counts: Counter) -> list[Sequence]:
    sequences = []
    for record in iter_records(root, split):
        if record["status"] != "ok":
            counts[f"skipped_{record['skip_reason']}"] += 1
            continue
        made = layout(tokenizer, record["id"], record["messages"], config.max_seq_len, record["chat_template_kwargs"])
        if not made:
            counts["skipped_empty_conversation"] += 1
        for sequence in made:
            counts["truncated"] += sequence.truncated
            if not sequence.loss_mask.any():
                counts["skipped_no_loss_tokens_after_truncation"] += 1
                continue
            sequences.append(sequence)
    return sequences


def _plan(split: str, sequences: list[Sequence], config: ExtractParams, meta: ShardMeta) -> list[ShardPlan]:
    per_token = len(meta.layer_ids) * meta.hidden_size * 2
    plans, current, size = [], [], 0
    for sequence in sequences:
        current.append(sequence)
        size += len(sequence.input_ids) * per_token
        if size >= config.shard_raw_mb * 2**20:
            plans.append(ShardPlan(split, len(plans), current))
            current, size = [], 0
    if current:
        plans.append(ShardPlan(split, len(plans), current))
    return plans


def _check_disk(out: Path, todo: list[ShardPlan], meta: ShardMeta, config: ExtractParams) -> None:
    if config.ignore_disk_check or not todo:
        return
    tokens = sum(len(s.input_ids) for plan in todo for s in plan.sequences)
    per_token = len(meta.layer_ids) * meta.hidden_size * 2
    ratio = EXPECTED_RATIO[meta.storage]
    needed = tokens * per_token / ratio
    free = shutil.disk_usage(out).free
    if free - needed < config.reserve_free_gb * 1e9:
        raise Eagle3Error(
            f"{out}: needs ~{needed / 1e9:.2f} GB for {len(todo)} shards ({tokens} tokens x {per_token} B/token / "
            f"{ratio} compression) plus extract.reserve_free_gb {config.reserve_free_gb} GB, but only "
            f"{free / 1e9:.2f} GB are free; free space, lower extract.reserve_free_gb, or set "
            "extract.ignore_disk_check: true"
        )


def _length_sorted_batches(sequences: list[Sequence], batch_tokens: int) -> list[list[int]]:
    """Positions in `sequences`, shortest first, cut into batches of up to `batch_tokens` padded tokens: a batch
    pads to its longest sequence, so neighbours in length waste little (default data, batch_tokens 8192: 1.02x
    padded tokens per real token, vs 1.55x in plan order)."""
    return cut_batches(
        sequences, sorted(range(len(sequences)), key=lambda i: len(sequences[i].input_ids)), batch_tokens
    )


def cut_batches(sequences: list[Sequence], order: list[int], batch_tokens: int) -> list[list[int]]:
    """Positions in `order`, cut into consecutive batches whose padded size (count x longest) fits `batch_tokens`."""
    batches, current, longest = [], [], 0
    for position in order:
        length = len(sequences[position].input_ids)
        if current and (len(current) + 1) * max(longest, length) > batch_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(position)
        longest = max(longest, length)
    if current:
        batches.append(current)
    return batches


def in_plan_order(
    backend: HiddenStateCapture, sequences: list[Sequence], batches: list[list[int]]
) -> Iterator[tuple[Sequence, torch.Tensor]]:
    """Run `batches` (positions in `sequences`) and hand on each sequence's states in plan order as soon as all
    before it are done, so a shard's bytes depend only on data and params. Holds at most one shard's states."""
    ready: dict[int, torch.Tensor] = {}
    position = 0
    for batch in batches:
        for index, hidden in zip(batch, backend.forward([sequences[i] for i in batch]), strict=True):
            ready[index] = hidden
        while position in ready:
            yield sequences[position], ready.pop(position)
            position += 1


def _write_index_and_metrics(
    root: Path, out: Path, plans: list[ShardPlan], meta: ShardMeta, counts: Counter, done_tokens: int, elapsed: float
) -> None:
    shards: dict[str, list[Path]] = {}
    for plan in plans:
        shards.setdefault(plan.split, []).append(out / plan.split / plan.path_name)
    totals = write_index(out, meta, shards)
    per_token = len(meta.layer_ids) * meta.hidden_size * 2
    metrics = {
        "samples": totals["samples"],
        "tokens": totals["tokens"],
        "loss_tokens": totals["loss_tokens"],
        "bytes_on_disk": totals["bytes"],
        "storage": meta.storage,
        "raw_bytes_per_token": per_token,
        "stored_bytes_per_token": round(totals["bytes"] / max(totals["tokens"], 1), 1),
        "compression_ratio": round(per_token * totals["tokens"] / max(totals["bytes"], 1), 3),
        "truncated": counts["truncated"],
        "skipped": {k.removeprefix("skipped_"): v for k, v in sorted(counts.items()) if k.startswith("skipped_")},
        # A rerun that found every shard finished measured nothing: it reports the run that did the work.
        "this_run": measured_run(
            root,
            "extract",
            {
                "tokens": done_tokens,
                "seconds": round(elapsed, 2),
                "tokens_per_s": round(done_tokens / elapsed, 1) if done_tokens and elapsed > 0 else None,
            },
            bool(done_tokens),
        ),
    }
    write_json(root / EXTRACT_METRICS, metrics)
    step(
        f"extracted {metrics['samples']} sequences, {metrics['tokens']} tokens: {metrics['bytes_on_disk'] / 2**20:.1f} "
        "MiB "
        f"({metrics['compression_ratio']}x smaller than raw); "
        + (f"this run {done_tokens / elapsed:.0f} tok/s" if done_tokens else "every shard was already finished")
    )
