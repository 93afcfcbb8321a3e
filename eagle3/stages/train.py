"""Stage `train`: the EAGLE-3 draft, trained with training-time test on the extracted hidden states.

The objective and one optimizer step are eagle3/training/objective.py; which samples form each batch,
eagle3/training/data.py; processes and devices, eagle3/training/distributed.py. This module is the loop:
build the draft, resume from the newest checkpoint, step, log, checkpoint.

Data: the training shards through HiddenStateDataset (DataLoader workers decompress in parallel). Under
torchrun (started by this stage as `train.launch` says: eagle3/training/launch.py) rank r takes every
world_size-th sequence of each global batch and the loss is normalised by global counts, so 1 and N processes
train the same model, with the draft replicated (DDP) or split over them (FSDP2) as `train.sharding` says.

Resume: a checkpoint (eagle3/formats/checkpoints.py) every `checkpoint_every` steps and at the end. The step
fixes the data position and the learning rate, so a rerun after kill -9 continues from the newest checkpoint
and ends at the same weights as an uninterrupted run (CPU), on the same or any other number of processes.
Curves go to metrics/train/ through DVCLive.
"""

import os
import time
from pathlib import Path
from typing import Any

import torch

from eagle3.environment import EnvironmentLog, capture, fingerprint
from eagle3.errors import Eagle3Error
from eagle3.formats.checkpoints import latest_checkpoint, load_checkpoint, read_state, save_checkpoint
from eagle3.formats.hf_config import read_config
from eagle3.formats.hf_weights import load_verifier_tensors
from eagle3.formats.provenance import Provenance, read_provenance, verifier_dir
from eagle3.formats.shards import HiddenStateDataset, read_index, split_shards
from eagle3.formats.vocab import load_vocab
from eagle3.hashing import sha256_file
from eagle3.modeling.draft import DraftConfig
from eagle3.params.base import StageParams, pinned_settings
from eagle3.params.train import TrainParams
from eagle3.paths import CHECKPOINT_DIR, HIDDEN_INDEX, VOCAB_FILE
from eagle3.progress import Quiet, progress, step
from eagle3.resume import resume_or_reset, run_key
from eagle3.training.data import BatchPlan, Collate, batches, measure_aux_scale
from eagle3.training.distributed import Dist, distribute, setup_distributed
from eagle3.training.launch import launch, launcher_command
from eagle3.training.log import Window, open_log
from eagle3.training.objective import (
    init_draft,
    learning_rate,
    make_objective,
    make_optimizer,
    train_step,
    training_precision,
)


class Params(StageParams):
    train: TrainParams = TrainParams()


def run(params: Params, root: Path, options=None) -> None:
    command = launcher_command(params.train.launch, getattr(options, "params_file", root / "params.yaml"))
    if command is not None:
        launch(command)
        return
    world = setup_distributed()
    try:
        _train(params.train, root, world)
    finally:
        world.close()


def run_settings(
    root: Path, config: TrainParams, draft_config: DraftConfig, provenance: Provenance, precision: str
) -> dict[str, Any]:
    """What the checkpoints are made from (the run key's input), the resolved training precision included."""
    return {
        "train": pinned_settings(config),
        "precision": precision,
        "draft": draft_config.to_json(),
        "vocab_sha256": sha256_file(root / VOCAB_FILE),
        "shards_index_sha256": sha256_file(root / HIDDEN_INDEX),
        "verifier": {**provenance.identity("name", "config_sha256"), **provenance.weights_identity()},
    }


def build(root: Path, config: TrainParams, provenance: Provenance) -> tuple[DraftConfig, HiddenStateDataset, dict]:
    """The draft's shape, the training shards and the vocab maps {"d2t", "t2d"}."""
    index = read_index(root)
    d2t, t2d = load_vocab(root, provenance.vocab_size)
    draft_config = DraftConfig.from_verifier(
        read_config(verifier_dir(root)),
        tuple(index["layer_ids"][:-1]),
        len(d2t),
        config.intermediate_size,
        config.attention,
    )
    if index["layer_ids"][-1] != provenance.num_hidden_layers:
        raise Eagle3Error(
            f"{root / HIDDEN_INDEX}: the last captured layer must be the final one "
            f"({provenance.num_hidden_layers}), got {index['layer_ids'][-1]}; rerun `eagle3 extract`"
        )
    expected = {
        "layer_ids": index["layer_ids"],
        "hidden_size": provenance.hidden_size,
        "tokenizer_sha256": provenance.tokenizer_sha256,
    }
    dataset = HiddenStateDataset(split_shards(root, "train"), expected, provenance.vocab_size)
    return draft_config, dataset, {"d2t": d2t, "t2d": t2d}


def _train(config: TrainParams, root: Path, world: Dist) -> None:
    provenance = read_provenance(root)
    draft_config, dataset, vocab = build(root, config, provenance)
    if config.max_tokens_per_batch is None:
        if config.batch_size % world.size:
            raise Eagle3Error(
                f"train.batch_size: {config.batch_size} must be a multiple of the number of processes ({world.size})"
            )
        if len(dataset) < config.batch_size:
            raise Eagle3Error(f"train.batch_size: {config.batch_size} exceeds the {len(dataset)} training sequences")
    out = root / CHECKPOINT_DIR
    precision = training_precision(config, world.device)
    settings = run_settings(root, config, draft_config, provenance, precision)
    environment = capture(world_size=world.size, compute_dtype=precision)
    if config.pin_environment:
        settings["environment"] = fingerprint(environment)
    if world.main and not resume_or_reset(out, settings).kept:
        step("train: no checkpoint made with these settings; starting fresh")
    world.barrier()

    verifier = load_verifier_tensors(verifier_dir(root))
    draft = init_draft(draft_config, verifier, vocab["d2t"], config.seed)
    plan = BatchPlan(
        dataset.lengths,
        config.batch_size,
        config.epochs,
        config.seed,
        world.rank,
        world.size,
        config.max_tokens_per_batch,
    )
    total = plan.total
    checkpoint = latest_checkpoint(out)
    if checkpoint is not None and read_state(checkpoint).step >= total:
        if world.main:
            step(f"train: all {total} steps already done ({checkpoint.name})")
        return
    # On the device and sharded before the optimizer is made on its parameters and their state is loaded.
    objective = make_objective(draft, verifier, vocab["d2t"], vocab["t2d"], config, precision).to(world.device)
    model = distribute(objective, world, config.sharding)
    optimizer = make_optimizer(draft, config)
    start = 0
    if checkpoint is not None:
        start = load_checkpoint(checkpoint, draft, optimizer).step
        if world.main:
            step(f"train: resuming from {checkpoint.name} ({start} of {total} steps done)")
    else:
        draft.aux_scale.copy_(measure_aux_scale(dataset, len(draft_config.aux_layer_ids)))
    plan.start = start

    workers = data_workers(config, world)
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_sampler=plan,
        collate_fn=Collate.for_draft(draft_config),
        num_workers=workers,
        prefetch_factor=4 if workers else None,
        # Page-locked batches let the copy to the GPU run asynchronously, overlapping the previous step.
        pin_memory=world.device.type == "cuda",
    )
    live = open_log(root, start if checkpoint is not None else None) if world.main else None
    window = Window(config.ttt_steps)
    # The steps up to each checkpoint it names were trained in this environment.
    log = EnvironmentLog(out, {**environment, "device": world.device.type})
    key = run_key(settings)
    started = time.monotonic()
    with progress() if world.main else Quiet() as bar:
        task = bar.add_task("train (steps)", total=total, completed=start)
        for step_index, batch in enumerate(batches(loader), start=start):
            batch = {k: v.to(world.device, non_blocking=True) for k, v in batch.items()}
            lr = learning_rate(config, step_index, total)
            for group in optimizer.param_groups:
                group["lr"] = lr
            result = train_step(model, objective, optimizer, batch, world, config.grad_clip, precision)
            window.add(result.sums, result.correct, result.counts, result.loss, batch["input_ids"].numel())
            done = step_index + 1
            if done % config.log_every == 0 or done == total:
                window.reduce(world)
                if live is not None:
                    window.log(live, done, lr)
            if done % config.checkpoint_every == 0 or done == total:
                saved = save_checkpoint(
                    out,
                    draft,
                    optimizer,
                    {"step": done, "total_steps": total, "run_key": key, "draft_config": draft_config.to_json()},
                    config.keep_checkpoints,
                    write=world.main,
                )
                if world.main:
                    log.made(saved.name)
                world.barrier()
            bar.advance(task)
    elapsed = time.monotonic() - started
    if live is not None:
        tokens_done = window.tokens
        live.summary["tokens_per_s_this_run"] = round(tokens_done / elapsed, 1) if elapsed > 0 else None
        live.summary["total_steps"] = total
        live.summary["train_sequences"] = len(dataset)
        live.summary["precision"] = precision
        live.make_summary()
        step(
            f"train: {total} steps, {tokens_done} padded tokens in {elapsed:.0f} s this run "
            f"({tokens_done / max(elapsed, 1e-9):.0f} tok/s); checkpoints in {out}"
        )


def data_workers(config: TrainParams, world: Dist) -> int:
    """DataLoader processes per training process. `auto`: one decodes ~870 MB/s of bf16 states on a server core
    (~15K Kimi-K2.5 tokens/s) while a GPU trains ~7K tokens/s, so 2 per GPU process keep it fed with headroom
    for long samples; on CPU one, since every worker takes a core from the training itself."""
    if config.num_workers != "auto":
        return config.num_workers
    wanted = 2 if world.device.type == "cuda" else 1
    return max(0, min(wanted, (os.cpu_count() or 1) // max(world.local_size, 1) - 1))
