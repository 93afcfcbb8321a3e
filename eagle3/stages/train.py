"""Stage `train`: the draft, trained on the extracted hidden states: the EAGLE-3 chain draft with training-time test,
or the DFlash block draft (`train.draft_method`).

The objectives and one optimizer step are eagle3/training/objective.py (DFlash's objective:
eagle3/training/dflash_objective.py); which samples form each batch, eagle3/training/data.py; processes and
devices, eagle3/training/distributed.py. This module is the run: set up (the draft, resumed from the newest
checkpoint), loop (optimizer steps, logged and checkpointed), summary.

Data (`train.hidden_states`, one TrainingData either way): stored, the training shards (DataLoader workers
decompress in parallel: eagle3/training/stored.py); streamed, the verifier's states computed for each batch
just before its step (eagle3/training/streamed.py), the same sequences in the same batches, nothing stored. Under
torchrun (started by this stage as `train.launch` says: eagle3/training/launch.py) rank r takes every
world_size-th sequence of each global batch and the loss is normalised by global counts, so 1 and N processes
train the same model, with the draft replicated (DDP) or split over them (FSDP2) as `train.sharding` says.

Resume: a checkpoint (eagle3/formats/checkpoints.py) every `checkpoint_every` optimizer steps and at the end.
The optimizer step fixes the data position and the learning rate, so a rerun after kill -9 continues from the
newest checkpoint and ends at the same weights as an uninterrupted run (CPU), on the same or any other number of
processes. Curves go to metrics/train/ through DVCLive.
"""

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from eagle3.chat.mask_token import configured_mask_token
from eagle3.environment import EnvironmentLog, capture, fingerprint
from eagle3.errors import Eagle3Error
from eagle3.formats.checkpoints import (
    CheckpointState,
    checkpoint_bytes,
    latest_checkpoint,
    load_checkpoint,
    read_state,
    save_checkpoint,
)
from eagle3.formats.hf_config import read_config
from eagle3.formats.hf_weights import load_verifier_tensors
from eagle3.formats.provenance import Provenance, checked_verifier_dir, read_provenance, verifier_dir
from eagle3.formats.vocab import VocabMaps, load_vocab
from eagle3.hashing import sha256_file
from eagle3.modeling.draft import Eagle3Draft
from eagle3.modeling.drafts import AnyDraft, AnyDraftConfig, training_config
from eagle3.params.base import StageParams, pinned_settings
from eagle3.params.extract import ExtractParams
from eagle3.params.train import TrainParams
from eagle3.paths import CHECKPOINT_DIR, VOCAB_FILE
from eagle3.progress import Quiet, progress, status
from eagle3.resume import resume_or_reset, run_key
from eagle3.training.data import BatchPlan, Collate, TrainingData, micro_batches_by_step
from eagle3.training.distributed import Dist, distribute, setup_distributed
from eagle3.training.launch import launch, launcher_command
from eagle3.training.log import Window, open_log
from eagle3.training.objective import (
    TrainingObjective,
    init_draft,
    learning_rate,
    make_objective,
    train_step,
    training_precision,
)
from eagle3.training.optimizers import DraftOptimizer, make_optimizer
from eagle3.training.stored import StoredData
from eagle3.training.streamed import StreamedData

if TYPE_CHECKING:
    from dvclive import Live

# Runs on the GPUs where there are any: refused where nvidia-smi lists GPUs that torch cannot see (eagle3/runner.py).
USES_GPUS = True


class Params(StageParams):
    train: TrainParams = TrainParams()
    # Streamed mode computes the states as extract would: its layers, sequence length, backend and dtype.
    extract: ExtractParams


def run(params: Params, root: Path, options=None) -> None:
    command = launcher_command(params.train.launch, getattr(options, "params_file", root / "params.yaml"))
    if command is not None:
        launch(command)
        return
    world = setup_distributed()
    try:
        _train(params, root, world)
    finally:
        world.close()


def run_settings(
    root: Path,
    config: TrainParams,
    draft_config: AnyDraftConfig,
    provenance: Provenance,
    precision: str,
    data: TrainingData,
) -> dict[str, Any]:
    """What the checkpoints are made from (the run key's input), the resolved training precision included, and
    where the states come from (the shards' index, or what extract's settings would make them from)."""
    return {
        "train": pinned_settings(config),
        "precision": precision,
        "draft": draft_config.to_json(),
        "vocab_sha256": sha256_file(root / VOCAB_FILE),
        "verifier": {**provenance.identity("name", "config_sha256"), **provenance.weights_identity()},
        **data.identity(),
    }


def open_training_data(root: Path, params: Params, provenance: Provenance, world: Dist) -> TrainingData:
    if params.train.hidden_states == "streamed":
        return StreamedData.open(root, params.extract, params.train, provenance, world)
    return StoredData(root, provenance, world)


def build(
    root: Path, params: Params, provenance: Provenance, world: Dist
) -> tuple[AnyDraftConfig, TrainingData, VocabMaps]:
    """The draft's shape, the training data and the vocab maps."""
    config = params.train
    vocab = load_vocab(root, provenance.vocab_size)
    data = open_training_data(root, params, provenance, world)
    verifier_config, aux_layer_ids = read_config(verifier_dir(root)), data.layer_ids[:-1]
    mask_token_id = configured_mask_token(root, provenance, config)
    draft_config = training_config(verifier_config, aux_layer_ids, len(vocab.d2t), config, mask_token_id)
    return draft_config, data, vocab


def _train(params: Params, root: Path, world: Dist) -> None:
    provenance = read_provenance(root)
    draft_config, data, vocab = build(root, params, provenance, world)
    try:
        run = set_up(params.train, root, world, provenance, draft_config, data, vocab)
        if run is None:
            return
        batches = start_batches(run, data)
        live = open_log(root, None if run.fresh else run.plan.start) if world.main else None
        tokens, elapsed = train_loop(run, batches, live)
        if live is not None:
            summarize(live, run, tokens, elapsed, data)
    finally:
        data.close()


@dataclass
class TrainingRun:
    """A run set up to step: the draft, what trains it, the steps it takes and where it records them."""

    config: TrainParams
    world: Dist
    draft_config: AnyDraftConfig
    draft: AnyDraft
    objective: TrainingObjective
    model: torch.nn.Module
    optimizer: DraftOptimizer
    plan: BatchPlan
    precision: str
    run_key: str
    out: Path
    environment_log: EnvironmentLog
    fresh: bool

    @property
    def optimizer_steps(self) -> int:
        return self.plan.total


def set_up(
    config: TrainParams,
    root: Path,
    world: Dist,
    provenance: Provenance,
    draft_config: AnyDraftConfig,
    data: TrainingData,
    vocab: VocabMaps,
) -> TrainingRun | None:
    """The run from its newest checkpoint made with these settings (or fresh), or None where it has taken every
    optimizer step already: decided before the verifier's embedding and head (gigabytes at a large verifier's
    shape) are read."""
    check_batch_size(config, world.size, len(data))
    out = root / CHECKPOINT_DIR
    precision = training_precision(config, world.device)
    settings = run_settings(root, config, draft_config, provenance, precision, data)
    environment = capture(world_size=world.size, compute_dtype=precision)
    if config.pin_environment:
        settings["environment"] = fingerprint(environment)
    if world.main and not resume_or_reset(out, settings).kept:
        status("train: no checkpoint made with these settings; starting fresh")
    world.barrier()
    plan = BatchPlan(
        data.lengths,
        config.batch_size,
        config.epochs,
        config.seed,
        world.rank,
        world.size,
        config.max_tokens_per_batch,
    )
    checkpoint = latest_checkpoint(out)
    if checkpoint is not None and read_state(checkpoint).step >= plan.total:
        if world.main:
            status(f"train: all {plan.total} optimizer steps already done ({checkpoint.name})")
        return None
    verifier = load_verifier_tensors(checked_verifier_dir(root))
    draft = init_draft(draft_config, verifier, vocab.d2t, config.seed, config.freeze_lm_head)
    # On the device and sharded before the optimizer is made on its parameters and their state is loaded.
    objective = make_objective(draft, verifier, vocab.d2t, vocab.t2d, config, precision).to(world.device)
    model = distribute(objective, world, config.sharding)
    optimizer = make_optimizer(draft, config)
    world.open_writer_wait(checkpoint_bytes(draft, optimizer))
    if checkpoint is not None:
        plan.start = load_checkpoint(checkpoint, draft, optimizer).step
        if world.main:
            status(f"train: resuming from {checkpoint.name} ({plan.start} of {plan.total} optimizer steps done)")
    return TrainingRun(
        config=config,
        world=world,
        draft_config=draft_config,
        draft=draft,
        objective=objective,
        model=model,
        optimizer=optimizer,
        plan=plan,
        precision=precision,
        run_key=run_key(settings),
        out=out,
        # The optimizer steps up to each checkpoint it names were taken in this environment.
        environment_log=EnvironmentLog(out, {**environment, "device": world.device.type}),
        fresh=checkpoint is None,
    )


def start_batches(run: TrainingRun, data: TrainingData) -> Iterator[dict[str, torch.Tensor]]:
    """This process's micro-batches from the plan's start; a fresh draft first gets fc's input scale."""
    collate = Collate.for_draft(run.draft_config)
    scale = data.begin(run.plan, run.config, collate, run.fresh)
    # The EAGLE-3 draft's doc says why; DFlash's fc output goes through hidden_norm, which removes any scale.
    if scale is not None and isinstance(run.draft, Eagle3Draft) and not run.draft.config.layout.normalises_aux:
        run.draft.aux_scale.copy_(scale)
    return data.batches(run.plan, run.config, collate)


def train_loop(run: TrainingRun, batches: Iterator[dict[str, torch.Tensor]], live: "Live | None") -> tuple[int, float]:
    """Every optimizer step from the plan's start: log every log_every (to `live` on rank 0), checkpoint every
    checkpoint_every and at the end. Returns the padded tokens trained on and the seconds it took."""
    config, world, plan, total = run.config, run.world, run.plan, run.optimizer_steps
    window = Window(run.objective.ttt_steps)
    started = time.monotonic()
    with progress() if world.main else Quiet() as bar:
        task = bar.add_task("train (optimizer steps)", total=total, completed=plan.start)
        grouped = micro_batches_by_step(batches, plan.micro_counts())
        for step_index, loaded in enumerate(grouped, start=plan.start):
            micro = [{k: v.to(world.device, non_blocking=True) for k, v in batch.items()} for batch in loaded]
            lr = learning_rate(config, step_index, total)
            for group in run.optimizer.param_groups:
                group["lr"] = lr
            result = train_step(run.model, run.objective, run.optimizer, micro, world, config.grad_clip, run.precision)
            window.add(
                result.sums, result.correct, result.counts, result.loss, sum(b["input_ids"].numel() for b in micro)
            )
            done = step_index + 1
            if done % config.log_every == 0 or done == total:
                window.reduce(world)
                if live is not None:
                    window.log(live, done, lr)
            if done % config.checkpoint_every == 0 or done == total:
                save(run, done)
            bar.advance(task)
            # Not held while the next batch is awaited: a verifier waking between phases gets the GPU memory back.
            del micro, loaded, result
    return window.tokens, time.monotonic() - started


def save(run: TrainingRun, done: int) -> None:
    """A checkpoint after `done` optimizer steps: every process takes part (sharded tensors are gathered)."""
    state = CheckpointState.of(run.draft_config, step=done, total_steps=run.optimizer_steps, run_key=run.run_key)
    saved = save_checkpoint(run.out, run.draft, run.optimizer, state, run.config.keep_checkpoints, write=run.world.main)
    if run.world.main:
        run.environment_log.made(saved.name)
    run.world.wait_for_writer()


def check_batch_size(config: TrainParams, processes: int, sequences: int) -> None:
    """Without a token budget, each process takes batch_size / processes whole sequences of each batch."""
    if config.max_tokens_per_batch is not None:
        return
    if config.batch_size % processes:
        raise Eagle3Error(
            f"train.batch_size: {config.batch_size} must be a multiple of the number of processes ({processes})"
        )
    if sequences < config.batch_size:
        raise Eagle3Error(f"train.batch_size: {config.batch_size} exceeds the {sequences} training sequences")


def summarize(live: "Live", run: TrainingRun, tokens: int, elapsed: float, data: TrainingData) -> None:
    """The run's summary in metrics/train/metrics.json, and on the console (rank 0)."""
    live.summary["tokens_per_s_this_run"] = round(tokens / elapsed, 1) if elapsed > 0 else None
    live.summary["total_steps"] = run.optimizer_steps
    live.summary["train_sequences"] = len(data)
    live.summary["precision"] = run.precision
    live.summary["hidden_states"] = run.config.hidden_states
    live.summary.update(data.summary())
    live.make_summary()
    status(
        f"train: {run.optimizer_steps} optimizer steps, {tokens} padded tokens in {elapsed:.0f} s this run "
        f"({tokens / max(elapsed, 1e-9):.0f} tok/s); checkpoints in {run.out}"
    )
