"""Stage `extract`: verifier hidden states for every regenerated conversation -> data/hidden/ shards.

Captured per token: the aux layers (vLLM ids, default (2, N//2, N-3)) and the
final layer's normed output (HF hidden_states[N]); the trainer gets the
verifier's next-token distribution as lm_head(final), so no logits are stored.
Token ids and loss mask come from eagle3/token_layout.py. Backends: `hf`
(transformers forward, padded batches) and `vllm` (vLLM's
extract_hidden_states method, eagle3/vllm_hidden_states.py); both store the
same tensors within bf16 tolerance, in the same plan.

Shards (eagle3/shards.py) are planned before any forward pass: sequences in
prepared order, a new shard whenever the raw hidden states reach
`shard_raw_mb`; within a shard, batches of up to `batch_tokens` padded
tokens of similar length, whose states are written back in plan order. The
plan and each batch depend only on the data and params, so a killed run redoes
only unfinished shards and the result is byte-identical to an uninterrupted
run.
`run.json` pins the settings the finished shards were made with.
"""

import hashlib
import json
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from eagle3.errors import Eagle3Error
from eagle3.files import measured_run, resume_or_reset, write_json
from eagle3.hashing import sha256_file
from eagle3.layout import HIDDEN_DIR, METRICS_DIR, SYNTHETIC_DIR, read_provenance, verifier_dir
from eagle3.params.extract import ExtractParams
from eagle3.progress import progress, step
from eagle3.shards import SUFFIX, VERSION, ShardMeta, ShardReader, ShardWriter
from eagle3.synthetic import iter_records
from eagle3.token_layout import Sequence, layout

METRICS = METRICS_DIR / "extract.json"
# Planning figure for the free-space check: what the shard codec achieved on real states (1.48x), rounded down.
EXPECTED_RATIO = 1.4
# Bump when the same inputs and params give other shard bytes (2: length-sorted batches, zstd hash_log 10), so the
# run key changes and shards made by older code are discarded, never mixed with new ones.
EXTRACTION_VERSION = 2
_EXECUTION_ONLY = {"compression_threads", "reserve_free_gb", "ignore_disk_check", "vllm"}
# Where the vllm backend's connector leaves each request's states until they are in a shard.
SPOOL = ".vllm-spool"


@dataclass
class ShardPlan:
    split: str
    index: int
    sequences: list[Sequence]

    @property
    def path_name(self) -> str:
        return f"shard-{self.index:05d}{SUFFIX}"


def layer_ids(config: ExtractParams, provenance: dict[str, Any]) -> tuple[int, ...]:
    layers = provenance["num_hidden_layers"]
    aux = config.aux_layer_ids or provenance["default_aux_layer_ids"]
    if max(aux) >= layers:
        raise Eagle3Error(f"extract.aux_layer_ids: {aux} must be < {layers} (the verifier's layer count)")
    return (*aux, layers)


def run(params, root: Path, options=None) -> None:
    config: ExtractParams = params.extract
    provenance = read_provenance(root)
    manifest = root / SYNTHETIC_DIR / "manifest.json"
    if not manifest.is_file():
        raise Eagle3Error(f"{manifest}: missing; run `dvc repro generate` first")
    meta = ShardMeta(provenance["name"], layer_ids(config, provenance), provenance["hidden_size"], provenance["tokenizer_sha256"])
    out = root / HIDDEN_DIR
    settings = {
        "shard_format": VERSION,
        "extraction": EXTRACTION_VERSION,
        "extract": {k: v for k, v in config.model_dump(mode="json").items() if k not in _EXECUTION_ONLY},
        "layer_ids": list(meta.layer_ids),
        "verifier": {k: provenance[k] for k in ("name", "config_sha256", "tokenizer_sha256", "chat_template_sha256")},
        "synthetic_manifest_sha256": sha256_file(manifest),
    }
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()
    if not resume_or_reset(out, key, settings):
        step("extract: no finished shards made with these settings; starting fresh")

    from transformers import AutoTokenizer

    trust = provenance.get("trust_remote_code", False)
    tokenizer = AutoTokenizer.from_pretrained(verifier_dir(root), trust_remote_code=trust)
    counts: Counter = Counter()
    plans: list[ShardPlan] = []
    for split in config.splits:
        plans += _plan(split, _sequences(root, split, tokenizer, config, counts), config, meta)
    todo = [plan for plan in plans if not (out / plan.split / plan.path_name).is_file()]
    _check_disk(out, todo, meta, config)

    started, done_tokens = time.monotonic(), 0
    spool = out / SPOOL
    shutil.rmtree(spool, ignore_errors=True)  # left by a killed vllm run; never part of the output
    if todo:
        step(f"extract: {len(todo)} of {len(plans)} shards to write, layers {list(meta.layer_ids)}, backend {config.backend}")
        backend = _backend(root, provenance, config, meta, spool)
        started = time.monotonic()
        try:
            with progress() as bar:
                task = bar.add_task("extract (tokens)", total=sum(len(s.input_ids) for p in todo for s in p.sequences))
                for plan in todo:
                    (out / plan.split).mkdir(parents=True, exist_ok=True)
                    with ShardWriter(out / plan.split / plan.path_name, meta, config.compression_level,
                                     config.compression_threads) as writer:
                        batches = _length_sorted_batches(plan.sequences, config.batch_tokens)
                        for sequence, hidden in in_plan_order(backend, plan.sequences, batches):
                            writer.add(sequence.sample_id, sequence.input_ids, sequence.loss_mask, hidden)
                            done_tokens += len(sequence.input_ids)
                            bar.advance(task, len(sequence.input_ids))
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
        made = layout(tokenizer, record["id"], record["messages"], config.max_seq_len)
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
    needed = tokens * per_token / EXPECTED_RATIO
    free = shutil.disk_usage(out).free
    if free - needed < config.reserve_free_gb * 1e9:
        raise Eagle3Error(
            f"{out}: needs ~{needed / 1e9:.2f} GB for {len(todo)} shards ({tokens} tokens x {per_token} B/token / "
            f"{EXPECTED_RATIO} compression) plus extract.reserve_free_gb {config.reserve_free_gb} GB, but only "
            f"{free / 1e9:.2f} GB are free; free space, lower extract.reserve_free_gb, or set extract.ignore_disk_check: true"
        )


def _length_sorted_batches(sequences: list[Sequence], batch_tokens: int) -> list[list[int]]:
    """Positions in `sequences`, shortest first, cut into batches of up to `batch_tokens` padded tokens: a batch
    pads to its longest sequence, so neighbours in length waste little (default data, batch_tokens 8192: 1.02x
    padded tokens per real token, vs 1.55x in plan order)."""
    return cut_batches(sequences, sorted(range(len(sequences)), key=lambda i: len(sequences[i].input_ids)), batch_tokens)


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


def in_plan_order(backend: Any, sequences: list[Sequence], batches: list[list[int]]) -> Iterator[tuple[Sequence, torch.Tensor]]:
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


def _backend(root: Path, provenance: dict[str, Any], config: ExtractParams, meta: ShardMeta, spool: Path) -> Any:
    if config.backend == "vllm":
        from eagle3.vllm_hidden_states import VllmHiddenStates

        return VllmHiddenStates(verifier_dir(root), provenance, meta.layer_ids, config.max_seq_len, config.vllm, spool)
    return HfHiddenStates(verifier_dir(root), provenance.get("trust_remote_code", False), meta.layer_ids)


class HfHiddenStates:
    def __init__(self, model_dir: Path, trust_remote_code: bool, layers: tuple[int, ...]):
        from transformers import AutoModel

        # The base model without lm_head: the vocabulary projection would cost ~3/4 of the time for logits nobody uses.
        self.model = AutoModel.from_pretrained(model_dir, dtype=torch.bfloat16, trust_remote_code=trust_remote_code).eval()
        self.layers = layers

    @torch.no_grad()
    def forward(self, batch: list[Sequence]) -> list[torch.Tensor]:
        """One padded forward pass; returns each sequence's [layers, tokens, hidden] bf16 states, padding removed."""
        longest = max(len(s.input_ids) for s in batch)
        input_ids = torch.zeros(len(batch), longest, dtype=torch.int64)
        attention = torch.zeros(len(batch), longest, dtype=torch.int64)
        for row, sequence in enumerate(batch):
            input_ids[row, : len(sequence.input_ids)] = sequence.input_ids
            attention[row, : len(sequence.input_ids)] = 1
        states = self.model(input_ids=input_ids, attention_mask=attention, output_hidden_states=True).hidden_states
        stacked = torch.stack([states[k] for k in self.layers], dim=1).to(torch.bfloat16)  # [batch, layers, tokens, hidden]
        return [stacked[row, :, : len(s.input_ids)].contiguous() for row, s in enumerate(batch)]

    def close(self) -> None:
        del self.model


def _write_index_and_metrics(root: Path, out: Path, plans: list[ShardPlan], meta: ShardMeta, counts: Counter,
                             done_tokens: int, elapsed: float) -> None:
    index: dict[str, list[dict[str, Any]]] = {}
    totals: Counter = Counter()
    for plan in plans:
        path = out / plan.split / plan.path_name
        reader = ShardReader(path)
        tokens = sum(e["tokens"] for e in reader.entries)
        loss_tokens = sum(e["loss_tokens"] for e in reader.entries)
        reader.close()
        size = path.stat().st_size
        index.setdefault(plan.split, []).append(
            {"shard": plan.path_name, "samples": len(reader), "tokens": tokens, "loss_tokens": loss_tokens, "bytes": size}
        )
        totals.update(samples=len(reader), tokens=tokens, loss_tokens=loss_tokens, bytes=size)
    write_json(out / "index.json", {"layer_ids": list(meta.layer_ids), "hidden_size": meta.hidden_size, "splits": index})
    per_token = len(meta.layer_ids) * meta.hidden_size * 2
    metrics = {
        "samples": totals["samples"],
        "tokens": totals["tokens"],
        "loss_tokens": totals["loss_tokens"],
        "bytes_on_disk": totals["bytes"],
        "raw_bytes_per_token": per_token,
        "stored_bytes_per_token": round(totals["bytes"] / max(totals["tokens"], 1), 1),
        "compression_ratio": round(per_token * totals["tokens"] / max(totals["bytes"], 1), 3),
        "truncated": counts["truncated"],
        "skipped": {k.removeprefix("skipped_"): v for k, v in sorted(counts.items()) if k.startswith("skipped_")},
        # A rerun that found every shard finished measured nothing: it reports the run that did the work.
        "this_run": measured_run(root, "extract", {
            "tokens": done_tokens, "seconds": round(elapsed, 2),
            "tokens_per_s": round(done_tokens / elapsed, 1) if done_tokens and elapsed > 0 else None}, bool(done_tokens)),
    }
    write_json(root / METRICS, metrics)
    step(f"extracted {metrics['samples']} sequences, {metrics['tokens']} tokens: {metrics['bytes_on_disk'] / 2**20:.1f} MiB "
         f"({metrics['compression_ratio']}x smaller than raw); "
         + (f"this run {done_tokens / elapsed:.0f} tok/s" if done_tokens else "every shard was already finished"))
