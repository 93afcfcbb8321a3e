"""Stage `train`: the EAGLE-3 draft, trained with training-time test on the extracted hidden states.

The objective and one optimizer step are eagle3/training/objective.py; which samples form each batch,
eagle3/training/data.py; processes and devices, eagle3/training/distributed.py. This module is the loop:
build the draft, resume from the newest checkpoint, step, log, checkpoint.

Data (`train.hidden_states`): stored, the training shards through HiddenStateDataset (DataLoader workers
decompress in parallel); streamed, the verifier's states computed for each batch just before its step
(eagle3/training/streamed.py), the same sequences in the same batches, nothing of them stored. Under
torchrun (started by this stage as `train.launch` says: eagle3/training/launch.py) rank r takes every
world_size-th sequence of each global batch and the loss is normalised by global counts, so 1 and N processes
train the same model, with the draft replicated (DDP) or split over them (FSDP2) as `train.sharding` says.

Resume: a checkpoint (eagle3/formats/checkpoints.py) every `checkpoint_every` steps and at the end. The step
fixes the data position and the learning rate, so a rerun after kill -9 continues from the newest checkpoint
and ends at the same weights as an uninterrupted run (CPU), on the same or any other number of processes.
Curves go to metrics/train/ through DVCLive.
"""

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from eagle3.environment import EnvironmentLog, capture, fingerprint
from eagle3.errors import Eagle3Error
from eagle3.formats.checkpoints import checkpoint_bytes, latest_checkpoint, load_checkpoint, read_state, save_checkpoint
from eagle3.formats.hf_config import read_config
from eagle3.formats.hf_weights import load_verifier_tensors
from eagle3.formats.provenance import Provenance, read_provenance, verifier_dir
from eagle3.formats.shards import HiddenStateDataset, read_index, split_shards
from eagle3.formats.vocab import load_vocab
from eagle3.hashing import sha256_file
from eagle3.modeling.draft import DraftConfig
from eagle3.params.base import StageParams, pinned_settings
from eagle3.params.extract import ExtractParams
from eagle3.params.train import TrainParams
from eagle3.paths import CHECKPOINT_DIR, HIDDEN_INDEX, VOCAB_FILE
from eagle3.progress import Quiet, progress, step
from eagle3.resume import resume_or_reset, run_key
from eagle3.training.data import (
    PREFETCH_BATCHES,
    SCALE_SAMPLES,
    BatchPlan,
    Collate,
    batches,
    data_workers,
    measure_aux_scale,
    micro_batches_by_step,
)
from eagle3.training.distributed import Dist, distribute, setup_distributed
from eagle3.training.launch import launch, launcher_command
from eagle3.training.log import Window, open_log
from eagle3.training.objective import (
    init_draft,
    learning_rate,
    make_objective,
    train_step,
    training_precision,
)
from eagle3.training.optimizers import make_optimizer
from eagle3.training.streamed import StreamedData

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
    root: Path, config: TrainParams, draft_config: DraftConfig, provenance: Provenance, precision: str, data: Any
) -> dict[str, Any]:
    """What the checkpoints are made from (the run key's input), the resolved training precision included; `data`
    says what the states are: the shards' index, or (streamed) what extract's settings would make them from."""
    settings = {
        "train": pinned_settings(config),
        "precision": precision,
        "draft": draft_config.to_json(),
        "vocab_sha256": sha256_file(root / VOCAB_FILE),
        "verifier": {**provenance.identity("name", "config_sha256"), **provenance.weights_identity()},
    }
    if isinstance(data, StreamedData):
        settings["streamed_states"] = data.settings
    else:
        settings["shards_index_sha256"] = sha256_file(root / HIDDEN_INDEX)
    return settings


def build(root: Path, params: Params, provenance: Provenance, world: Dist) -> tuple[DraftConfig, Any, dict]:
    """The draft's shape, the training data (the shards, or their streamed stand-in) and the vocab maps."""
    config = params.train
    d2t, t2d = load_vocab(root, provenance.vocab_size)
    if config.hidden_states == "streamed":
        data: Any = StreamedData.open(root, params.extract, config, provenance, world)
        layers = data.layer_ids
    else:
        index = read_index(root)
        layers = tuple(index["layer_ids"])
        if layers[-1] != provenance.num_hidden_layers:
            raise Eagle3Error(
                f"{root / HIDDEN_INDEX}: the last captured layer must be the final one "
                f"({provenance.num_hidden_layers}), got {layers[-1]}; rerun `eagle3 extract`"
            )
        expected = {
            "layer_ids": index["layer_ids"],
            "hidden_size": provenance.hidden_size,
            "tokenizer_sha256": provenance.tokenizer_sha256,
        }
        data = HiddenStateDataset(split_shards(root, "train"), expected, provenance.vocab_size)
    draft_config = DraftConfig.from_verifier(
        read_config(verifier_dir(root)),
        layers[:-1],
        len(d2t),
        config.intermediate_size,
        config.attention,
        config.draft_layout,
    )
    return draft_config, data, {"d2t": d2t, "t2d": t2d}


def _train(params: Params, root: Path, world: Dist) -> None:
    provenance = read_provenance(root)
    draft_config, dataset, vocab = build(root, params, provenance, world)
    try:
        _fit(params.train, root, world, provenance, draft_config, dataset, vocab)
    finally:
        if isinstance(dataset, StreamedData):
            dataset.close()


def first_states(data: HiddenStateDataset) -> Iterable[torch.Tensor]:
    """The stored states of the first samples, which fc's input scale is measured on."""
    return (data[position]["hidden"] for position in range(min(SCALE_SAMPLES, len(data))))


def _fit(
    config: TrainParams,
    root: Path,
    world: Dist,
    provenance: Provenance,
    draft_config: DraftConfig,
    dataset: Any,
    vocab: dict,
) -> None:
    check_batch_size(config, world.size, len(dataset))
    out = root / CHECKPOINT_DIR
    precision = training_precision(config, world.device)
    settings = run_settings(root, config, draft_config, provenance, precision, dataset)
    environment = capture(world_size=world.size, compute_dtype=precision)
    if config.pin_environment:
        settings["environment"] = fingerprint(environment)
    if world.main and not resume_or_reset(out, settings).kept:
        step("train: no checkpoint made with these settings; starting fresh")
    world.barrier()
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
    # Decided before the verifier's embedding and head (gigabytes at a large verifier's shape) are read.
    if checkpoint is not None and read_state(checkpoint).step >= total:
        if world.main:
            step(f"train: all {total} steps already done ({checkpoint.name})")
        return
    verifier = load_verifier_tensors(verifier_dir(root))
    draft = init_draft(draft_config, verifier, vocab["d2t"], config.seed, config.freeze_lm_head)
    # On the device and sharded before the optimizer is made on its parameters and their state is loaded.
    objective = make_objective(draft, verifier, vocab["d2t"], vocab["t2d"], config, precision).to(world.device)
    model = distribute(objective, world, config.sharding)
    optimizer = make_optimizer(draft, config)
    start = 0
    if checkpoint is not None:
        start = load_checkpoint(checkpoint, draft, optimizer).step
        if world.main:
            step(f"train: resuming from {checkpoint.name} ({start} of {total} steps done)")
    plan.start = start
    loader, scale = open_loader(config, world, dataset, plan, draft_config, fresh=checkpoint is None)
    if checkpoint is None and not draft_config.layout.normalises_aux:  # the draft's doc says why
        draft.aux_scale.copy_(scale)
    live = open_log(root, start if checkpoint is not None else None) if world.main else None
    window = Window(config.ttt_steps)
    # The steps up to each checkpoint it names were trained in this environment.
    log = EnvironmentLog(out, {**environment, "device": world.device.type})
    key = run_key(settings)
    started = time.monotonic()
    with progress() if world.main else Quiet() as bar:
        task = bar.add_task("train (steps)", total=total, completed=start)
        grouped = micro_batches_by_step(batches(loader), plan.micro_counts())
        for step_index, loaded in enumerate(grouped, start=start):
            micro = [{k: v.to(world.device, non_blocking=True) for k, v in batch.items()} for batch in loaded]
            lr = learning_rate(config, step_index, total)
            for group in optimizer.param_groups:
                group["lr"] = lr
            result = train_step(model, objective, optimizer, micro, world, config.grad_clip, precision)
            window.add(
                result.sums, result.correct, result.counts, result.loss, sum(b["input_ids"].numel() for b in micro)
            )
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
                world.wait_for_writer(checkpoint_bytes(draft, optimizer))
            bar.advance(task)
            # Not held while the next batch is awaited: a verifier waking between phases gets the GPU memory back.
            del micro, loaded, result
    if live is not None:
        summarize(live, config, window.tokens, time.monotonic() - started, total, dataset, precision, out)


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


def open_loader(
    config: TrainParams, world: Dist, dataset: Any, plan: BatchPlan, draft_config: DraftConfig, fresh: bool
) -> tuple[Any, torch.Tensor | None]:
    """This process's batches from the plan's start, and (a fresh run) fc's input scale measured on the states."""
    collate = Collate.for_draft(draft_config)
    # Page-locked batches let the copy to the GPU run asynchronously, overlapping the previous step.
    pinned = world.device.type == "cuda"
    if isinstance(dataset, StreamedData):
        # From the resumed step, as the producer counts its phases, and before any state is computed.
        dataset.check_buffer(plan, collate.layers, collate.hidden, config)
        scale = dataset.start(plan, config, collate.layers, collate.hidden, fresh=fresh)
        return dataset.batches(plan, collate, pinned), scale
    scale = measure_aux_scale(first_states(dataset), len(draft_config.aux_layer_ids)) if fresh else None
    workers = data_workers(config, world)
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_sampler=plan,
        collate_fn=collate,
        num_workers=workers,
        prefetch_factor=PREFETCH_BATCHES if workers else None,
        pin_memory=pinned,
    )
    return loader, scale


def summarize(
    live: Any, config: TrainParams, tokens: int, elapsed: float, total: int, dataset: Any, precision: str, out: Path
) -> None:
    """The run's summary in metrics/train/metrics.json, and on the console."""
    live.summary["tokens_per_s_this_run"] = round(tokens / elapsed, 1) if elapsed > 0 else None
    live.summary["total_steps"] = total
    live.summary["train_sequences"] = len(dataset)
    live.summary["precision"] = precision
    live.summary["hidden_states"] = config.hidden_states
    if isinstance(dataset, StreamedData):
        live.summary.update(dataset.summary())
    live.make_summary()
    step(
        f"train: {total} steps, {tokens} padded tokens in {elapsed:.0f} s this run "
        f"({tokens / max(elapsed, 1e-9):.0f} tok/s); checkpoints in {out}"
    )
