"""Stage `extract`: verifier hidden states for every regenerated conversation -> data/hidden/ shards.

Captured per token: the aux layers (vLLM ids, default (2, N//2, N-3)) and the
final layer's normed output (HF hidden_states[N]); the trainer gets the
verifier's next-token distribution as lm_head(final), so no logits are stored.
Token ids and loss mask come from eagle3/chat/token_layout.py. Backends
(eagle3/engines/hidden_states/): `hf` (transformers forward, padded batches)
and `vllm` (vLLM's extract_hidden_states method); both store the same tensors
within bf16 tolerance, in the same plan.

Streaming: the work unit is one synthetic part (generate's output). A part is
planned from its own records alone (tokenized, its sequences in prepared order
cut into shards `shard-PPPPP-NNN` whenever the raw states reach
`shard_raw_mb`), by a background thread one part ahead of the forward passes,
so planning memory does not grow with the dataset and overlaps the verifier.
Within a shard, batches of up to `batch_tokens` padded tokens of similar
length, whose states are written back in plan order. When a part's shards are
all written, `part-PPPPP.done.json` (eagle3/formats/extracted_parts.py)
records them with the part's counts (skips, truncations). A restart skips done parts without reading them and
redoes only the missing shards of the others, so the result is byte-identical
to an uninterrupted run; `--rank R --world-size W` takes the parts whose index
% W == R, with the same shards as one process (the index and metrics are
written by the run that finds every part done, as for generate).
`run.json` pins the settings the finished shards were made with.
"""

import argparse
import contextlib
import shutil
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from eagle3.background import Background, one_ahead
from eagle3.chat.sequence_plan import Part, load_tokenizer, part_sequences, synthetic_parts
from eagle3.chat.token_layout import Sequence
from eagle3.engines.hidden_states.backends import open_capture
from eagle3.engines.hidden_states.base import (
    EXTRACTION_VERSION,
    CaptureRequest,
    HiddenStateCapture,
    compute_dtype,
    layer_ids,
)
from eagle3.engines.hidden_states.batching import in_plan_order, part_batches
from eagle3.environment import EnvironmentLog, fingerprint
from eagle3.errors import Eagle3Error
from eagle3.files import write_json
from eagle3.formats.extracted_parts import PartDone, is_done, read_done, write_done
from eagle3.formats.provenance import TEXT_IDENTITY, Provenance, checked_verifier_dir, read_provenance
from eagle3.formats.shards import VERSION, ShardMeta, ShardWriter, shard_name, write_index
from eagle3.formats.storage import STORAGES
from eagle3.formats.synthetic import SyntheticRecord, read_part
from eagle3.hashing import sha256_file
from eagle3.params.base import StageParams, pinned_settings
from eagle3.params.extract import ExtractParams
from eagle3.paths import EXTRACT_METRICS, HIDDEN_DIR, SYNTHETIC_MANIFEST, VLLM_SPOOL
from eagle3.progress import progress, status
from eagle3.resume import measured_run, resume_or_reset
from eagle3.scale_out import Slice
from eagle3.scale_out import add_arguments as add_arguments  # the runner gives this stage --rank / --world-size

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Runs on the GPUs where there are any: refused where nvidia-smi lists GPUs that torch cannot see (eagle3/runner.py).
USES_GPUS = True


class Params(StageParams):
    extract: ExtractParams


@dataclass
class ShardPlan:
    split: str
    part: int
    number: int
    sequences: list[Sequence]

    @property
    def path_name(self) -> str:
        return shard_name(self.part, self.number)


@dataclass
class PartPlan:
    part: Part
    shards: list[ShardPlan]
    counts: Counter = field(default_factory=Counter)


def shard_meta(config: ExtractParams, provenance: Provenance) -> ShardMeta:
    """What every shard this config makes from this verifier says about itself."""
    return ShardMeta(
        provenance.name,
        layer_ids(config, provenance),
        provenance.hidden_size,
        provenance.tokenizer_sha256,
        storage=config.storage,
    )


def raw_bytes_per_token(meta: ShardMeta) -> int:
    """The captured layers of one token in bf16, before any compression."""
    return len(meta.layer_ids) * meta.hidden_size * 2


def run(params: Params, root: Path, options: argparse.Namespace | None = None) -> None:
    config = params.extract
    ranks = Slice.from_options(options)
    provenance = read_provenance(root)
    manifest = root / SYNTHETIC_MANIFEST
    if not manifest.is_file():
        raise Eagle3Error(f"{manifest}: missing; run `dvc repro generate` first")
    meta = shard_meta(config, provenance)
    out = root / HIDDEN_DIR
    dtype = compute_dtype(config)
    settings = run_settings(config, provenance, meta, manifest)
    tensor_parallel = config.vllm.tensor_parallel_size if config.backend == "vllm" else None
    if config.pin_environment:
        settings["environment"] = fingerprint(
            ranks.environment(tensor_parallel_size=tensor_parallel, compute_dtype=dtype)
        )
    if not resume_or_reset(out, settings).kept:
        status("extract: no finished shards made with these settings; starting fresh")

    parts = synthetic_parts(root, config.splits)
    todo = [part for part in parts if ranks.owns(part.index) and not _is_done(out, part)]
    started, extracted = time.monotonic(), Extracted()
    # Per rank, so ranks sharing the directory never remove each other's; left by a killed vllm run, never output.
    spool = root / VLLM_SPOOL / f"rank{ranks.rank}"
    shutil.rmtree(spool, ignore_errors=True)
    if todo:
        status(
            f"extract: {len(todo)} of {len(parts)} parts to do (rank {ranks.rank}/{ranks.world_size}), layers "
            f"{list(meta.layer_ids)}, backend {config.backend}"
        )
        model_dir = checked_verifier_dir(root)
        tokenizer = load_tokenizer(root, provenance)
        backend = open_capture(
            CaptureRequest(
                model_dir=model_dir,
                provenance=provenance,
                layer_ids=meta.layer_ids,
                config=config,
                spool=spool,
                dtype=dtype,
            )
        )
        log = EnvironmentLog(
            out,
            {**ranks.environment(tensor_parallel_size=tensor_parallel, compute_dtype=dtype), "backend": config.backend},
            ranks.rank,
        )
        sink = ShardSink(out, meta, config, log)
        extracted = sink.extracted
        started = time.monotonic()
        try:
            with progress() as bar:
                task = bar.add_task("extract (parts)", total=len(todo))
                for done, plan in enumerate(planned_parts(todo, tokenizer, config, meta)):
                    remaining = [s for s in plan.shards if not (out / s.split / s.path_name).is_file()]
                    _check_disk(out, remaining, meta, config, len(todo) - done)
                    write_shards(backend, sink, plan, remaining)
                    write_done(
                        out / plan.part.split,
                        plan.part.index,
                        PartDone([s.path_name for s in plan.shards], dict(plan.counts)),
                    )
                    bar.update(task, advance=1, description=f"extract (parts; {extracted.tokens:,} tokens)")
        finally:
            backend.close()
            shutil.rmtree(spool, ignore_errors=True)
            with contextlib.suppress(OSError):  # another rank may still be using it
                spool.parent.rmdir()
    elapsed = time.monotonic() - started
    missing = [f"{part.split}/{part.path.name}" for part in parts if not _is_done(out, part)]
    if not ranks.finished_unless_missing("extract", missing):
        return
    _write_index_and_metrics(root, out, parts, meta, dtype, extracted, elapsed)


def run_settings(config: ExtractParams, provenance: Provenance, meta: ShardMeta, manifest: Path) -> dict[str, Any]:
    """What the shards are made from (the run key's input, before `pin_environment`): params without execution-only
    settings, the compute dtype they resolve to here, the layers, the verifier's identity, the synthetic data."""
    return {
        "shard_format": VERSION,
        "extraction": EXTRACTION_VERSION,
        "extract": pinned_settings(config),
        "compute_dtype": compute_dtype(config),
        "layer_ids": list(meta.layer_ids),
        "verifier": {**provenance.identity(*TEXT_IDENTITY), **provenance.weights_identity()},
        "synthetic_manifest_sha256": sha256_file(manifest),
    }


def _is_done(out: Path, part: Part) -> bool:
    return is_done(out / part.split, part.index)


def planned_parts(
    parts: list[Part], tokenizer: "PreTrainedTokenizerBase", config: ExtractParams, meta: ShardMeta
) -> Iterator[PartPlan]:
    """The parts' plans in order, made by a background thread one part ahead of the consumer (tokenization
    overlaps the forward passes; at most two parts' plans exist at a time)."""
    return one_ahead(plan_part(part, read_part(part.path), tokenizer, config, meta) for part in parts)


def plan_part(
    part: Part,
    records: Iterable[SyntheticRecord],
    tokenizer: "PreTrainedTokenizerBase",
    config: ExtractParams,
    meta: ShardMeta,
) -> PartPlan:
    """A part's sequences in prepared order, cut into shards whenever their raw states reach shard_raw_mb."""
    plan = PartPlan(part, [])
    per_token = raw_bytes_per_token(meta)
    current, size = [], 0
    for sequence in part_sequences(records, tokenizer, config.max_seq_len, plan.counts):
        current.append(sequence)
        size += len(sequence.input_ids) * per_token
        if size >= config.shard_raw_mb * 2**20:
            plan.shards.append(ShardPlan(part.split, part.index, len(plan.shards), current))
            current, size = [], 0
    if current:
        plan.shards.append(ShardPlan(part.split, part.index, len(plan.shards), current))
    return plan


@dataclass
class Extracted:
    tokens: int = 0
    forward_passes: int = 0


class ShardSink:
    """Where a part's states go, one shard after another in plan order: the shard being written, what has been
    extracted, and the environment log that names each finished shard. `add` runs on the writing thread alone;
    the main thread reads `extracted` (a progress figure, exact once the writer has finished)."""

    def __init__(self, out: Path, meta: ShardMeta, config: ExtractParams, log: EnvironmentLog):
        self.out, self.meta, self.config, self.log = out, meta, config, log
        self.extracted = Extracted()
        self._open: ShardWriter | None = None

    def add(self, shard: ShardPlan, sequence: Sequence, hidden: torch.Tensor) -> None:
        """One sequence's states into `shard`, opening it at its first sequence and finishing it at its last."""
        if self._open is None:
            path = self.out / shard.split / shard.path_name
            self._open = ShardWriter(path, self.meta, self.config.compression_level, self.config.compression_threads)
        self._open.add(sequence.sample_id, sequence.input_ids, sequence.loss_mask, hidden)
        self.extracted.tokens += len(sequence.input_ids)
        if sequence is shard.sequences[-1]:
            self._open.close()
            self._open = None
            self.log.made(f"{shard.split}/{shard.path_name}")

    def abort(self) -> None:
        """The writer stopped: the shard it had open is removed (its finished ones stay)."""
        if self._open is not None:
            self._open.abort()
            self._open = None


def write_shards(backend: HiddenStateCapture, sink: ShardSink, plan: PartPlan, remaining: list[ShardPlan]) -> None:
    """Write the `remaining` shards of a part through `sink`. Batches come from the whole part (`part_batches`), so
    a shard's bytes never depend on which of its neighbours were already done; a batch that holds none of the
    remaining shards' sequences is not run, one that holds some also recomputes its others (discarded)."""
    config = sink.config
    sequences = [sequence for shard in plan.shards for sequence in shard.sequences]
    owner = [number for number, shard in enumerate(plan.shards) for _ in shard.sequences]
    wanted = {shard.number for shard in remaining}
    positions = [position for position, number in enumerate(owner) if number in wanted]
    batches = [
        batch
        for batch in part_batches([shard.sequences for shard in plan.shards], config.batch_tokens, backend.pads_batches)
        if any(owner[position] in wanted for position in batch)
    ]
    (sink.out / plan.part.split).mkdir(parents=True, exist_ok=True)

    def write(position: int, hidden: torch.Tensor) -> None:
        sink.add(plan.shards[owner[position]], sequences[position], hidden)

    # Compressing and writing run beside the next forward passes; the engine waits only when the writer is a
    # whole batch of samples behind (the queue's depth bounds the states held for it).
    writing = Background(write, depth=max(config.compression_threads, 1))
    try:
        for position, hidden in in_plan_order(backend, sequences, batches, positions):
            writing.put(position, hidden)
        writing.finish()
    except BaseException:
        writing.abandon()
        sink.abort()
        raise
    sink.extracted.forward_passes += len(batches)


def _check_disk(out: Path, shards: list[ShardPlan], meta: ShardMeta, config: ExtractParams, parts_left: int) -> None:
    """Before each part: the space its shards need, times the parts left (streaming plans one part at a time, so
    the next part stands for the rest), must leave reserve_free_gb free."""
    if config.ignore_disk_check or not shards:
        return
    tokens = sum(len(s.input_ids) for shard in shards for s in shard.sequences)
    per_token = raw_bytes_per_token(meta)
    ratio = STORAGES[meta.storage].planning_ratio
    needed = tokens * per_token / ratio * parts_left
    free = shutil.disk_usage(out).free
    if free - needed < config.reserve_free_gb * 1e9:
        raise Eagle3Error(
            f"{out}: needs ~{needed / 1e9:.2f} GB for the {parts_left} parts left (the next one: {tokens} tokens x "
            f"{per_token} B/token / {ratio} compression) plus extract.reserve_free_gb {config.reserve_free_gb} GB, "
            f"but only {free / 1e9:.2f} GB are free; free space, lower extract.reserve_free_gb, or set "
            "extract.ignore_disk_check: true"
        )


def _write_index_and_metrics(
    root: Path, out: Path, parts: list[Part], meta: ShardMeta, dtype: str, extracted: Extracted, elapsed: float
) -> None:
    done_tokens = extracted.tokens
    shards: dict[str, list[Path]] = {}
    counts: Counter = Counter()
    for part in parts:
        record = read_done(out / part.split, part.index)
        shards.setdefault(part.split, []).extend(out / part.split / name for name in record.shards)
        counts.update(record.counts)
    totals = write_index(out, meta, shards)
    per_token = raw_bytes_per_token(meta)
    metrics: dict[str, Any] = {
        "samples": totals["samples"],
        "tokens": totals["tokens"],
        "loss_tokens": totals["loss_tokens"],
        "bytes_on_disk": totals["bytes"],
        "storage": meta.storage,
        "compute_dtype": dtype,
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
                # How full the engine was kept (the vllm backend's batches cross shard boundaries).
                "forward_passes": extracted.forward_passes,
                "tokens_per_forward_pass": round(done_tokens / extracted.forward_passes, 1)
                if extracted.forward_passes
                else None,
            },
            bool(done_tokens),
        ),
    }
    write_json(root / EXTRACT_METRICS, metrics)
    status(
        f"extracted {metrics['samples']} sequences, {metrics['tokens']} tokens: {metrics['bytes_on_disk'] / 2**20:.1f} "
        "MiB "
        f"({metrics['compression_ratio']}x smaller than raw); "
        + (f"this run {done_tokens / elapsed:.0f} tok/s" if done_tokens else "every shard was already finished")
    )
