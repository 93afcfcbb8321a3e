"""Stage `train`: the EAGLE-3 draft, trained with training-time test on the extracted hidden states.

Objective (SpecForge's, on vLLM's inference path, eagle3/model.py): the draft
is unrolled `ttt_steps` times; at step i position t predicts token t+2+i and
is scored by soft cross-entropy against the verifier's own next-token
distribution there, softmax(lm_head(final hidden)) restricted to the draft
vocab, weighted step_weight**i. A position counts when the token it predicts
is an assistant token (loss mask) the draft vocab can express. Each step's
loss is averaged over the positions that count in the whole global batch.

Data: the training shards through HiddenStateDataset (DataLoader workers
decompress in parallel). Epoch e visits the samples in a permutation seeded by
(seed, e), in global batches of `batch_size` sequences; under torchrun rank r
takes every world_size-th sequence of each batch and the loss is normalised
by global counts, so 1 and N processes train the same model.

Resume: a checkpoint (model + AdamW state + step, safetensors + JSON) every
`checkpoint_every` steps and at the end. The step fixes the data position and
the learning rate, so a rerun after kill -9 continues from the newest
checkpoint and ends at the same weights as an uninterrupted run (CPU).
Curves go to metrics/train/ through DVCLive (`dvc plots show`).
"""

import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
import torch.nn.functional as F
from torch import nn

from eagle3.errors import Eagle3Error
from eagle3.files import resume_or_reset, write_json
from eagle3.hashing import sha256_file
from eagle3.layout import CHECKPOINT_DIR, HIDDEN_DIR, TRAIN_LOG_DIR, VOCAB_DIR, read_provenance, train_shards, verifier_dir
from eagle3.model import DraftConfig, Eagle3Draft, read_verifier_config
from eagle3.params.train import TrainParams
from eagle3.progress import progress, step
from eagle3.shards import HiddenStateDataset, ShardReader
from eagle3.verifier_weights import load_verifier_tensors
from eagle3.vocab import load_vocab

_EXECUTION_ONLY = {"checkpoint_every", "keep_checkpoints", "log_every", "num_workers"}
# Samples used to measure the per-channel scale of fc's input (their first token, an attention sink, excluded).
_SCALE_SAMPLES = 64


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def all_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            dist.all_reduce(tensor)
        return tensor


def setup_distributed() -> Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Dist(device=torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
        dist.init_process_group("nccl")
        return Dist(rank, world, torch.device("cuda", local))
    dist.init_process_group("gloo")
    return Dist(rank, world, torch.device("cpu"))


class Objective(nn.Module):
    """Draft + the frozen verifier pieces the loss needs; one forward = one training-time-test unroll, so DDP sees
    a single forward per step."""

    def __init__(self, draft: Eagle3Draft, embed: torch.Tensor, draft_lm_head: torch.Tensor, t2d: torch.Tensor,
                 steps: int, step_weight: float):
        super().__init__()
        self.draft = draft
        self.embed = nn.Embedding.from_pretrained(embed, freeze=True)
        self.register_buffer("target_head", draft_lm_head, persistent=False)
        self.register_buffer("t2d", t2d, persistent=False)
        self.steps, self.weights = steps, [step_weight**i for i in range(steps)]

    def targets(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """Verifier distribution over the draft vocab [B, T, Vd], its top-1 [B, T], and per step which positions
        count [B, T]."""
        with torch.no_grad():
            logits = batch["final"].to(self.target_head.dtype) @ self.target_head.T
            probs = logits.float().softmax(-1)
            ids, mask = batch["input_ids"], batch["loss_mask"]
            counts = mask & self.t2d[ids]
            masks = []
            for i in range(self.steps):
                shifted = torch.zeros_like(counts)
                shifted[:, : max(ids.shape[1] - 2 - i, 0)] = counts[:, 2 + i :]
                masks.append(shifted)
        return probs, logits.argmax(-1), masks

    def forward(self, batch: dict[str, torch.Tensor], probs: torch.Tensor, top1: torch.Tensor,
                masks: list[torch.Tensor], global_counts: torch.Tensor,
                world: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Returns (loss to backpropagate, per-step loss sums, per-step correct counts) for this process's slice."""
        features = self.draft.unroll(batch["input_ids"], batch["aux"], self.embed, self.steps)
        loss = torch.zeros((), device=probs.device)
        sums, correct = [], []
        tokens = probs.shape[1]
        for i, (step_features, mask) in enumerate(zip(features, masks, strict=True)):
            # Only positions that count go through norm + lm_head: the vocabulary projection is the costliest part.
            where = mask[:, : tokens - 1 - i]
            logits = self.draft.logits(step_features[mask]).float()
            step_sum = F.cross_entropy(logits, probs[:, 1 + i :][where], reduction="sum")
            sums.append(step_sum.detach())
            correct.append((logits.argmax(-1) == top1[:, 1 + i :][where]).sum())
            loss = loss + self.weights[i] * step_sum / global_counts[i].clamp(min=1)
        # DDP averages gradients over processes; the global normalisation above wants their sum.
        return loss * world, torch.stack(sums), torch.stack(correct)


def collate(samples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    longest = max(len(s["input_ids"]) for s in samples)
    layers, _, hidden = samples[0]["hidden"].shape
    input_ids = torch.zeros(len(samples), longest, dtype=torch.int64)
    loss_mask = torch.zeros(len(samples), longest, dtype=torch.bool)
    states = torch.zeros(len(samples), longest, layers, hidden, dtype=torch.bfloat16)
    for row, sample in enumerate(samples):
        n = len(sample["input_ids"])
        input_ids[row, :n], loss_mask[row, :n] = sample["input_ids"], sample["loss_mask"]
        states[row, :n] = sample["hidden"].transpose(0, 1)
    return {"input_ids": input_ids, "loss_mask": loss_mask,
            "aux": states[:, :, :-1].reshape(len(samples), longest, (layers - 1) * hidden), "final": states[:, :, -1]}


class BatchPlan(torch.utils.data.Sampler):
    """This rank's share of every global batch from step `start` on.

    Epoch e draws a permutation seeded by (seed, e); each window of 16 batches' worth of samples is sorted by
    length and cut into batches (little padding), and the epoch's batches are then shuffled with the same seed.
    The order depends only on the data and params, which is what makes resume exact."""

    WINDOW = 16

    def __init__(self, lengths: torch.Tensor, batch_size: int, epochs: int, seed: int, start: int, rank: int, world: int):
        self.lengths, self.batch_size, self.epochs, self.seed = lengths, batch_size, epochs, seed
        self.start, self.rank, self.world = start, rank, world
        self.per_epoch = len(lengths) // batch_size

    def __len__(self) -> int:
        return self.per_epoch * self.epochs - self.start

    def epoch(self, epoch: int) -> list[torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed * 100003 + epoch)
        order = torch.randperm(len(self.lengths), generator=generator)[: self.per_epoch * self.batch_size]
        batches = []
        for first in range(0, len(order), self.batch_size * self.WINDOW):
            window = order[first : first + self.batch_size * self.WINDOW]
            window = window[torch.argsort(self.lengths[window], stable=True)]
            batches += list(window.split(self.batch_size))
        return [batches[i] for i in torch.randperm(len(batches), generator=generator)]

    def __iter__(self):
        for epoch in range(self.start // self.per_epoch, self.epochs):
            batches = self.epoch(epoch)
            for position in range(max(self.start - epoch * self.per_epoch, 0), self.per_epoch):
                yield batches[position][self.rank :: self.world].tolist()


def sample_lengths(dataset: HiddenStateDataset) -> torch.Tensor:
    lengths = []
    for path in dataset.paths:
        reader = ShardReader(path)
        lengths += [entry["tokens"] for entry in reader.entries]
        reader.close()
    return torch.tensor(lengths)


def make_optimizer(draft: nn.Module, config: TrainParams) -> torch.optim.Optimizer:
    # The fused kernel makes a whole training step 1.3x faster on this CPU than the per-parameter loop
    # (benchmarks/train_step.py); it exists for CPU and CUDA and is as deterministic, so resume stays exact.
    return torch.optim.AdamW(draft.parameters(), lr=config.learning_rate, betas=(0.9, 0.95),
                             weight_decay=config.weight_decay, fused=True)


def learning_rate(config: TrainParams, step_index: int, total: int) -> float:
    if step_index < config.warmup_steps:
        return config.learning_rate * (step_index + 1) / config.warmup_steps
    progress_ = (step_index - config.warmup_steps) / max(total - config.warmup_steps, 1)
    cosine = 0.5 * (1 + math.cos(math.pi * min(progress_, 1.0)))
    return config.min_learning_rate + (config.learning_rate - config.min_learning_rate) * cosine


def measure_aux_scale(dataset: HiddenStateDataset, layers: int) -> torch.Tensor:
    """Per-channel RMS of fc's input over the first samples, skipping each sequence's first (attention-sink) token."""
    squares, count = None, 0
    for position in range(min(_SCALE_SAMPLES, len(dataset))):
        aux = dataset[position]["hidden"][:layers, 1:].float()  # [layers, tokens, hidden]
        flat = aux.transpose(0, 1).reshape(aux.shape[1], -1)
        squares = flat.pow(2).sum(0) if squares is None else squares + flat.pow(2).sum(0)
        count += flat.shape[0]
    return (squares / max(count, 1)).sqrt().clamp(min=1e-2)


# ---- checkpoints -------------------------------------------------------------------------------------------


def _checkpoints(out: Path) -> list[Path]:
    return sorted(p for p in out.glob("step-*") if p.is_dir() and (p / "state.json").is_file())


def latest_checkpoint(out: Path) -> Path | None:
    found = _checkpoints(out)
    return found[-1] if found else None


def save_checkpoint(out: Path, draft: Eagle3Draft, optimizer: torch.optim.Optimizer, state: dict[str, Any],
                    keep: int) -> Path:
    final = out / f"step-{state['step']:07d}"
    partial = out / f".{final.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    save_file({k: v.detach().contiguous() for k, v in draft.state_dict().items()}, str(partial / "model.safetensors"))
    names = {id(p): n for n, p in draft.named_parameters()}
    tensors = {}
    for group in optimizer.param_groups:
        for param in group["params"]:
            for key, value in optimizer.state.get(param, {}).items():
                tensors[f"{names[id(param)]}::{key}"] = value.detach().reshape(-1) if value.dim() == 0 else value.detach()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(partial / "optimizer.safetensors"))
    write_json(partial / "state.json", state)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(partial, final)
    for old in _checkpoints(out)[:-keep]:
        shutil.rmtree(old)
    return final


def load_checkpoint(path: Path, draft: Eagle3Draft, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    draft.load_state_dict(load_file(str(path / "model.safetensors")))
    if optimizer is not None:
        tensors = load_file(str(path / "optimizer.safetensors"))
        params = dict(draft.named_parameters())
        for key, value in tensors.items():
            name, field = key.split("::")
            optimizer.state[params[name]][field] = value.reshape(()) if field == "step" else value
    return json.loads((path / "state.json").read_text(encoding="utf-8"))


# ---- DVCLive -----------------------------------------------------------------------------------------------


def open_log(root: Path, resume_step: int | None):
    """DVCLive over metrics/train; on resume, rows logged after the checkpoint are dropped first, so a resumed run's
    curves equal an uninterrupted run's."""
    from dvclive import Live

    log_dir = root / TRAIN_LOG_DIR
    if resume_step is None:
        shutil.rmtree(log_dir, ignore_errors=True)
    else:
        for tsv in (log_dir / "plots" / "metrics").rglob("*.tsv"):
            lines = tsv.read_text(encoding="utf-8").splitlines(keepends=True)
            tsv.write_text("".join(lines[:1] + [line for line in lines[1:] if int(line.split("\t")[0]) <= resume_step]))
    # DVC runs this stage, so DVCLive's own DVC/git integration (experiments, dvc.yaml) stays off. It would still
    # open the repository from the working directory, and that fails in a git repository without commits
    # (scmrepo: "Empty git repo"); built from a neutral directory with an absolute `dir`, it only writes its files.
    previous = Path.cwd()
    with tempfile.TemporaryDirectory() as neutral:
        os.chdir(neutral)
        try:
            return Live(dir=str(log_dir.resolve()), resume=resume_step is not None, save_dvc_exp=False, dvcyaml=None,
                        report=None)
        finally:
            os.chdir(previous)


# ---- the stage ---------------------------------------------------------------------------------------------


def run_key(root: Path, config: TrainParams, draft_config: DraftConfig, provenance: dict[str, Any]) -> tuple[str, dict]:
    settings = {
        "train": {k: v for k, v in config.model_dump(mode="json").items() if k not in _EXECUTION_ONLY},
        "draft": draft_config.to_json(),
        "vocab_sha256": sha256_file(root / VOCAB_DIR / "vocab.safetensors"),
        "shards_index_sha256": sha256_file(root / HIDDEN_DIR / "index.json"),
        "verifier": {k: provenance[k] for k in ("name", "config_sha256", "weight_headers_sha256")},
    }
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest(), settings


def build(root: Path, config: TrainParams, provenance: dict[str, Any]) -> tuple[DraftConfig, HiddenStateDataset, dict]:
    index = json.loads((root / HIDDEN_DIR / "index.json").read_text(encoding="utf-8"))
    d2t, t2d = load_vocab(root)
    draft_config = DraftConfig.from_verifier(read_verifier_config(verifier_dir(root)), tuple(index["layer_ids"][:-1]),
                                             len(d2t), config.intermediate_size)
    if index["layer_ids"][-1] != provenance["num_hidden_layers"]:
        raise Eagle3Error(f"{root / HIDDEN_DIR / 'index.json'}: the last captured layer must be the final one "
                          f"({provenance['num_hidden_layers']}), got {index['layer_ids'][-1]}; rerun `eagle3 extract`")
    expected = {"layer_ids": index["layer_ids"], "hidden_size": provenance["hidden_size"],
                "tokenizer_sha256": provenance["tokenizer_sha256"]}
    dataset = HiddenStateDataset(train_shards(root), expected)
    return draft_config, dataset, {"d2t": d2t, "t2d": t2d}


def run(params, root: Path, options=None) -> None:
    config: TrainParams = params.train
    world = setup_distributed()
    try:
        _train(config, root, world)
    finally:
        if world.world > 1:
            dist.destroy_process_group()


def _train(config: TrainParams, root: Path, world: Dist) -> None:
    provenance = read_provenance(root)
    draft_config, dataset, vocab = build(root, config, provenance)
    if config.batch_size % world.world:
        raise Eagle3Error(f"train.batch_size: {config.batch_size} must be a multiple of the number of processes ({world.world})")
    if len(dataset) < config.batch_size:
        raise Eagle3Error(f"train.batch_size: {config.batch_size} exceeds the {len(dataset)} training sequences")
    out = root / CHECKPOINT_DIR
    key, settings = run_key(root, draft_config=draft_config, config=config, provenance=provenance)
    if world.main and not resume_or_reset(out, key, settings):
        step("train: no checkpoint made with these settings; starting fresh")
    world.barrier()

    torch.manual_seed(config.seed)
    draft = Eagle3Draft(draft_config)
    verifier = load_verifier_tensors(verifier_dir(root))
    draft_ids = torch.arange(len(vocab["d2t"])) + vocab["d2t"]
    draft.init_weights(torch.Generator().manual_seed(config.seed), verifier["lm_head"][draft_ids])
    steps_per_epoch = len(dataset) // config.batch_size
    total = steps_per_epoch * config.epochs
    optimizer = make_optimizer(draft, config)
    checkpoint = latest_checkpoint(out)
    start = 0
    if checkpoint is not None:
        start = load_checkpoint(checkpoint, draft, optimizer)["step"]
        if world.main:
            step(f"train: resuming from {checkpoint.name} ({start} of {total} steps done)")
    else:
        draft.aux_scale.copy_(measure_aux_scale(dataset, len(draft_config.aux_layer_ids)))
    if start >= total:
        if world.main:
            step(f"train: all {total} steps already done ({checkpoint.name})")
        return

    # The target head runs in the training precision: in bf16 the verifier's logits cost a fraction of fp32's.
    head_dtype = torch.bfloat16 if config.precision == "bf16" else torch.float32
    objective = Objective(draft, verifier["embed"], verifier["lm_head"][draft_ids].to(head_dtype), vocab["t2d"],
                          config.ttt_steps, config.step_weight).to(world.device)
    model: nn.Module = objective
    if world.world > 1:
        # Buffers (the verifier's head rows, aux_scale) are identical on every rank by construction: no broadcast.
        model = nn.parallel.DistributedDataParallel(objective, broadcast_buffers=False,
                                                    device_ids=[world.device.index] if world.device.type == "cuda" else None)
    loader = torch.utils.data.DataLoader(
        dataset, batch_sampler=BatchPlan(sample_lengths(dataset), config.batch_size, config.epochs, config.seed, start,
                                         world.rank, world.world),
        collate_fn=collate, num_workers=config.num_workers, prefetch_factor=4 if config.num_workers else None,
    )
    live = open_log(root, start if checkpoint is not None else None) if world.main else None
    autocast = torch.autocast(world.device.type, dtype=torch.bfloat16, enabled=config.precision == "bf16")
    window = {"loss": torch.zeros(config.ttt_steps), "correct": torch.zeros(config.ttt_steps),
              "counts": torch.zeros(config.ttt_steps), "objective": 0.0, "steps": 0}
    tokens_done, started = 0, time.monotonic()
    with progress() if world.main else _Quiet() as bar:
        task = bar.add_task("train (steps)", total=total, completed=start)
        for step_index, batch in enumerate(loader, start=start):
            batch = {k: v.to(world.device) for k, v in batch.items()}
            lr = learning_rate(config, step_index, total)
            for group in optimizer.param_groups:
                group["lr"] = lr
            probs, top1, masks = objective.targets(batch)
            counts = world.all_sum(torch.stack([m.sum() for m in masks]).float())
            with autocast:
                loss, sums, correct = model(batch, probs, top1, masks, counts, world.world)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(draft.parameters(), config.grad_clip)
            optimizer.step()

            stats = world.all_sum(torch.cat([sums.float(), correct.float()]).cpu())
            window["loss"] += stats[: config.ttt_steps]
            window["correct"] += stats[config.ttt_steps :]
            window["counts"] += counts.cpu()
            window["objective"] += float(world.all_sum(loss.detach().cpu() / world.world))
            window["steps"] += 1
            tokens_done += int(world.all_sum(torch.tensor(batch["input_ids"].numel())))
            done = step_index + 1
            if live is not None and (done % config.log_every == 0 or done == total):
                _log(live, done, lr, window, config)
            if done % config.checkpoint_every == 0 or done == total:
                if world.main:
                    save_checkpoint(out, draft, optimizer, {"step": done, "total_steps": total, "run_key": key,
                                                            "draft_config": draft_config.to_json()},
                                    config.keep_checkpoints)
                world.barrier()
            bar.advance(task)
    elapsed = time.monotonic() - started
    if live is not None:
        live.summary["tokens_per_s_this_run"] = round(tokens_done / elapsed, 1) if elapsed > 0 else None
        live.summary["total_steps"] = total
        live.summary["train_sequences"] = len(dataset)
        live.make_summary()
        step(f"train: {total} steps, {tokens_done} padded tokens in {elapsed:.0f} s this run "
             f"({tokens_done / max(elapsed, 1e-9):.0f} tok/s); checkpoints in {out}")


def _log(live, done: int, lr: float, window: dict, config: TrainParams) -> None:
    live.step = done
    live.log_metric("train/loss", round(window["objective"] / max(window["steps"], 1), 6))
    live.log_metric("train/lr", lr)
    for i in range(config.ttt_steps):
        count = float(window["counts"][i])
        if count:
            live.log_metric(f"train/acc_{i}", round(float(window["correct"][i]) / count, 6))
            live.log_metric(f"train/ce_{i}", round(float(window["loss"][i]) / count, 6))
    live.make_summary()
    for key in ("loss", "correct", "counts"):
        window[key].zero_()
    window["objective"], window["steps"] = 0.0, 0


class _Quiet:
    """Stands in for the progress bar on ranks other than 0."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def add_task(self, *args, **kwargs):
        return 0

    def advance(self, *args):
        pass
