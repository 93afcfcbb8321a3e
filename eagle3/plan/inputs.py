"""Where each input of `eagle3 plan` comes from: flags, presets, the project's measured metrics and DVC config, and
the verifier's own config (eagle3/plan/verifier.py). Every value is checked here, so a bad one ends in one
error line naming its flag, and each input that was not given says its source (`Inputs.sources`) or why it may
mislead (`Inputs.warnings`)."""

import argparse
from pathlib import Path
from typing import Any

from eagle3.errors import Eagle3Error
from eagle3.formats.hf_config import text_config
from eagle3.formats.provenance import read_provenance, verifier_location
from eagle3.gpu_kinds import GPUS
from eagle3.params.train import DraftLayout, TrainParams, draft_settings
from eagle3.paths import EXTRACT_METRICS, PROVENANCE, VERIFIER_DIR
from eagle3.plan.configured import FINAL_LAYERS, Configured
from eagle3.plan.configured import apply as apply_configuration
from eagle3.plan.facts import (
    GB,
    GPU_MEMORY_UTILIZATION,
    PRESETS,
    TB,
    TRAIN_MEASURED,
    Inputs,
    Machine,
    VerifierShape,
    size,
    weights_fit,
)
from eagle3.plan.flags import validate_args
from eagle3.plan.links import (
    REMOTE_DOWN_ASSUMED,
    CacheLink,
    check_cache_link,
    probe_link,
    remote_speeds,
    sha256_bytes_per_s,
)
from eagle3.plan.measured import CompressionRatio, Measured, compression_ratio, read_measurements
from eagle3.plan.memory import (
    TrainMemory,
    block_draft_train_rate,
    compute_train_memory,
    draft_figures,
    estimate,
    memory_warning,
)
from eagle3.plan.model import HASH_THREADS, SERVER_LOAD_BYTES_PER_S
from eagle3.plan.preflight_reports import PreflightFigures, disk_words, preflights
from eagle3.plan.verifier import require_parameter_count, verifier_from_args
from eagle3.plan.work import RunWork, measured_mean_tokens, run_work, serving_rate
from eagle3.training.data import tokens_per_process

# This machine's data volume where neither --here-disk-tb nor --here-preflight says.
HERE_DISK_TB = 3.0
# The verifier planned for where neither --verifier nor the params name one the plan knows: the hero run's.
DEFAULT_VERIFIER = "kimi-k2.5"


def machines(
    args: argparse.Namespace, there_disk_tb: float | None, here_disk_tb: float | None, weights_bytes: float | None
) -> tuple[Machine, Machine]:
    """The rented machine and this one, from their GPU presets and the flags that override them; the disks as
    --disk-tb / --here-disk-tb, else as a preflight measured them (free space), else unknown there and here
    HERE_DISK_TB less the verifier's weights, which docs/hero-run.md keeps on that volume (here_disk_default)."""
    gpu = GPUS[args.gpu]
    usd = gpu.usd_per_hour if args.gpu_usd_per_hour is None else args.gpu_usd_per_hour
    there_disk = args.disk_tb if args.disk_tb is not None else there_disk_tb
    here_disk = args.here_disk_tb if args.here_disk_tb is not None else here_disk_tb
    if here_disk is None:
        here_disk = here_disk_default(weights_bytes)[0]
    there = Machine(args.gpu, args.gpus, args.gpu_tflops or gpu.bf16_tflops, usd, there_disk)
    here = Machine(args.here_gpu, args.here_gpus, GPUS[args.here_gpu].bf16_tflops, 0.0, here_disk)
    return there, here


def here_disk_default(weights_bytes: float | None) -> tuple[float, str]:
    """This machine's disk for the project where nothing measured or gave it, and how it reads in the sources."""
    if not weights_bytes:
        return HERE_DISK_TB, f"default: {HERE_DISK_TB:g} TB"
    return (
        HERE_DISK_TB - weights_bytes / TB,
        f"default: {HERE_DISK_TB:g} TB less the verifier's {size(weights_bytes)} of weights kept on it "
        "(docs/hero-run.md); --here-disk-tb, or --here-preflight measures it",
    )


def _machine_words(machine: Machine) -> str:
    return f"{machine.gpus} x {GPUS[machine.gpu].name}: {machine.tflops:g} TFLOP/s, {machine.memory_gb:g} GB"


def _derived_words(machine: Machine, mfu: float) -> str:
    return f"derived: {machine.gpus} GPUs x {machine.tflops:g} TFLOP/s x MFU {mfu:g}"


def here_extraction_rate(
    args: argparse.Namespace, measured: Measured, here: Machine, preflight: PreflightFigures
) -> tuple[float | None, str]:
    """Extraction speed here and its source: --here-tokens-per-s, else --here-preflight's, else the metrics' on this
    verifier; None: the plan derives it from FLOP/s."""
    if args.here_tokens_per_s is not None:
        return args.here_tokens_per_s, "--here-tokens-per-s"
    if preflight.extract_tokens_per_s is not None:
        return preflight.extract_tokens_per_s, preflight.sources["extract"]
    metrics = measured.metrics
    rate = (metrics.get("this_run") or {}).get("tokens_per_s") if measured.same_verifier and metrics else None
    if isinstance(rate, (int, float)) and rate > 0:
        shown = args.metrics or EXTRACT_METRICS
        return float(rate), f"{shown} this_run.tokens_per_s, measured here on {measured.verifier}"
    elsewhere = f" (the measured rate is {measured.verifier}'s, not this verifier's)" if measured.verifier else ""
    return None, f"{_derived_words(here, args.mfu)} x share {args.here_share:g}{elsewhere}"


def _train_source(
    args: argparse.Namespace, there: Machine, preflight: PreflightFigures, block_draft: str | None
) -> str:
    if args.train_tokens_per_s is not None:
        return "--train-tokens-per-s per GPU"
    if preflight.train_tokens_per_s_per_gpu is not None:
        return f"{preflight.sources['train']}, per GPU x {there.gpus} GPUs"
    measured_gpu = GPUS[TRAIN_MEASURED.gpu]
    return (
        f"measured {TRAIN_MEASURED.tokens_per_s:,.0f} tokens/s on one {measured_gpu.name} "
        f"({TRAIN_MEASURED.sample_tokens:,}-token samples, {TRAIN_MEASURED.ttt_steps} TTT steps) x "
        f"{there.tflops:g} / {measured_gpu.bf16_tflops:g} TFLOP/s, {there.gpus} GPUs"
        + (f"; a block draft: {block_draft}" if block_draft else "")
    )


def _block_draft_rate(
    args: argparse.Namespace,
    there: Machine,
    preflight: PreflightFigures,
    drafted: dict[str, Any],
    shape: dict[str, Any],
    aux_layers: int,
) -> tuple[float | None, str | None]:
    """A block draft's training tokens/s per GPU where neither given nor measured (block_draft_train_rate)."""
    given = args.train_tokens_per_s is not None or preflight.train_tokens_per_s_per_gpu is not None
    if shape.get("draft_method") != "dflash" or given:
        return None, None
    rate, words = block_draft_train_rate(drafted, args.draft_vocab, shape, round(args.mean_tokens), aux_layers)
    return rate * there.tflops / GPUS[TRAIN_MEASURED.gpu].bf16_tflops, words


def collect_warnings(
    verifier: VerifierShape,
    measured: Measured,
    compression: CompressionRatio,
    train_memory: TrainMemory,
    max_tokens: int,
    recompute: str,
    there: Machine,
    here: Machine,
    cache: CacheLink,
) -> list[str]:
    """Each input that may mislead, in the order the plan prints them."""
    warnings = []
    if compression.measured_elsewhere:
        warnings.append(
            f"the compression ratio {compression.ratio:g} was measured on {measured.on}'s states, not "
            f"{verifier.name}'s; split-byte zstd of bf16 states should carry over (docs/pipeline.md, extract), but "
            "measure it on a few real samples and pass --compression-ratio"
        )
    long_sample = memory_warning(train_memory, max_tokens, recompute)
    if long_sample is not None:
        warnings.append(long_sample)
    for side, machine in (("here", here), ("there", there)):
        if not weights_fit(verifier.known_weights_bytes, machine):
            warnings.append(
                f"the verifier's {verifier.known_weights_bytes / GB:,.0f} GB of weights do not fit {side} "
                f"({machine.gpus} x {machine.memory_gb:g} GB x {GPU_MEMORY_UTILIZATION}); check "
                + ("--here-gpu/--here-gpus" if side == "here" else "--gpu/--gpus")
            )
    if cache.assumed:
        warnings.append(
            "DVC's default cache type (reflink,copy) copies on ext4, storing every output twice: run "
            "`dvc config --local cache.type hardlink,symlink` on both machines (--cache-link copy shows the cost)"
        )
    return warnings


def _choose_verifier(args: argparse.Namespace, root: Path, configured: Configured) -> str:
    """--verifier, else the configured verifier where the plan knows its shape (a preset of that name, its
    directory here, or the verifier stage's copy of it here), else, with no verifier configured, the kimi-k2.5
    preset; where it came from. A configured verifier whose shape is not here is refused: a plan for another
    model's shape would price the wrong run."""
    if args.verifier is not None:
        return "--verifier"
    name, params = configured.verifier_name, configured.path
    if name is None or params is None:  # no params file (Configured sets all of it or none)
        args.verifier = DEFAULT_VERIFIER
        return f"default of --verifier ({DEFAULT_VERIFIER})"
    preset = next((key for key, shape in PRESETS.items() if shape.name == name), None)
    if preset is not None:
        args.verifier = preset
        return f"{params.name} verifier.source.name ({name}: preset {preset})"
    if configured.verifier_local:
        try:
            directory, setting = verifier_location(root)
        except Eagle3Error:
            directory = None
        if directory is not None and directory.is_dir():
            args.verifier = str(directory)
            return f"{params.name} verifier ({setting}: {directory})"
    if (root / PROVENANCE).is_file() and read_provenance(root).name == name:
        args.verifier = str(root / VERIFIER_DIR)
        return f"{params.name} verifier ({name}, as the verifier stage recorded it in {VERIFIER_DIR})"
    raise Eagle3Error(
        f"--verifier: {params.name} configures {name}, whose shape the plan does not know here (not a preset, no "
        f"directory, the verifier stage has not run here): pass --verifier with its config.json or model directory, "
        f"or run `dvc repro verifier` first"
    )


def planned_work(args: argparse.Namespace, root: Path, configured: Configured) -> RunWork:
    """The runbook's counted work from the params and the project; without a params file, one answer of the mean
    sample's length per sample and no evaluation."""
    if configured.params is not None:
        return run_work(configured.params, root, configured.verifier_name)
    return RunWork(
        answers=args.samples,
        answers_source="no params file: one answer per sample (assumed)",
        answer_tokens=args.mean_tokens,
        answer_tokens_source="--mean-tokens each (assumed)",
        evaluation=[],
        evaluation_source="no params file: evaluation not priced",
        evaluate_max_tokens=0,
        evaluate_on_servers=True,
        extract_on_vllm=True,
        held_out_tokens=0,
    )


def draft_shape(args: argparse.Namespace, configured: Configured) -> dict[str, Any]:
    """The train settings that decide the draft (draft_settings): the params file's (the defaults without
    one), its layout as --draft-layout and its optimizer as --optimizer say."""
    train = configured.params.train if configured.params is not None else TrainParams()
    layout = {name: name in args.draft_layout for name in DraftLayout.model_fields}
    return {**draft_settings(train), "draft_layout": layout, "optimizer": args.optimizer}


# Where the verifier's config does not say how its attention is split into heads (a shape given by flags), the draft
# is built with heads of this size (what Kimi-K2.5's and most large verifiers' drafts have), or the largest even
# size below it that divides the hidden size.
ASSUMED_HEAD_DIM = 128


def draft_config(verifier: VerifierShape) -> tuple[dict[str, Any], str]:
    """The verifier config every draft figure (its size, checkpoints, training memory) is built from, and where its
    shape came from: the verifier's own, with heads of ASSUMED_HEAD_DIM where it names none."""
    config = verifier.config
    source = "the train stage's draft, built on the meta device from the verifier's config"
    if text_config(config).get("num_attention_heads"):
        return config, source
    hidden = verifier.hidden_size
    head_dim = max((d for d in range(2, ASSUMED_HEAD_DIM + 1, 2) if hidden % d == 0), default=hidden)
    heads = hidden // head_dim
    completed = {
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        **text_config(config),
        "hidden_size": verifier.hidden_size,
        "num_hidden_layers": verifier.num_layers,
        "vocab_size": verifier.vocab_size,
        "intermediate_size": verifier.intermediate_size,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
    }
    return completed, source + f" ({heads} heads of {head_dim} assumed: the verifier's config gives none)"


def inputs_from_args(args: argparse.Namespace, root: Path) -> Inputs:
    """Every input, each from the first place that has it, checked, with its source and the warnings."""
    configured, configuration = apply_configuration(args, args.params)
    mean_tokens_source = measured_mean_tokens(args, root, configured)
    if args.samples is None:
        raise Eagle3Error(
            "--samples: how many training samples to plan for (no params file, or its prepare.max_rows is null)"
        )
    verifier_source = _choose_verifier(args, root, configured)
    checked = validate_args(args, configuration)
    verifier = verifier_from_args(args)
    there_preflight, here_preflight = preflights(args, verifier)
    preflight_ratio = there_preflight if there_preflight.compression_ratio is not None else here_preflight
    measured = read_measurements(args, root, verifier, preflight_ratio.compression_ratio is not None)
    compression = compression_ratio(args, measured, preflight_ratio)
    there, here = machines(args, there_preflight.disk_tb, here_preflight.disk_tb, verifier.weights_bytes)
    here_tokens_per_s, here_source = here_extraction_rate(args, measured, here, here_preflight)
    there_measured = args.extract_tokens_per_s is not None or there_preflight.extract_tokens_per_s is not None
    here_measured = args.here_tokens_per_s is not None or here_preflight.extract_tokens_per_s is not None
    require_parameter_count(args, verifier, there_measured, here_measured)
    cache = check_cache_link(args, root)
    link = probe_link(args, root)
    shape = draft_shape(args, configured)
    drafted, draft_source = draft_config(verifier)
    aux_layers = args.layers - FINAL_LAYERS
    memory = estimate(drafted, args.draft_vocab, args.ttt_steps, there.gpus, args.sharding, shape, aux_layers)
    block_rate, block_words = _block_draft_rate(args, there, there_preflight, drafted, shape, aux_layers)
    process_tokens = checked.max_tokens  # without params: one longest sample per GPU
    if configured.params is not None:
        train = configured.params.train
        process_tokens = tokens_per_process(
            train.max_tokens_per_batch, train.batch_size, there.gpus, checked.max_tokens
        )
    there_price = f"${there.usd_per_gpu_hour:g}/GPU-hour" + (" (preset)" if args.gpu_usd_per_hour is None else "")
    there_tokens_per_s = args.extract_tokens_per_s or there_preflight.extract_tokens_per_s
    if args.extract_tokens_per_s is not None:
        extract_there = "--extract-tokens-per-s"
    else:
        extract_there = there_preflight.sources.get("extract") or _derived_words(there, args.mfu)
    work = planned_work(args, root, configured)
    streamed: tuple[float | None, bool | None] = (None, None)
    if configured.layout == "C" and configured.params is not None:  # layout C is read from the params
        train, extract = configured.params.train, configured.params.extract
        streamed = (extract.vllm.gpu_memory_utilization, train.stream_phase_steps is not None)
    serve, serve_source = serving_rate(args, root, configured)
    here_words = f"{here.gpus} x {GPUS[here.gpu].name}"
    there_words = f"{there.gpus} x {GPUS[there.gpu].name}"
    sources = {
        "serve": serve_source,
        "serve_there": f"serving here per GPU and TFLOP/s, on {there_words} (here {here_words})",
        "server_start": "--server-start-min"
        if args.server_start_min is not None
        else "the weights read at 2 GB/s, plus a minute for CUDA graphs and the KV cache (assumption)",
        "mean_tokens": mean_tokens_source,
        "verifier": verifier_source,
        "compression_ratio": compression.source,
        "there": f"{_machine_words(there)}, {there_price}"
        + disk_words(there, "--disk-tb", args.disk_tb, there_preflight),
        "here": _machine_words(here)
        + disk_words(
            here, "--here-disk-tb", args.here_disk_tb, here_preflight, here_disk_default(verifier.weights_bytes)[1]
        ),
        "extract_there": extract_there,
        "extract_here": here_source,
        "train": _train_source(args, there, there_preflight, block_words),
        "optimizer_step": there_preflight.sources.get("optimizer_step", ""),
        "train_memory": memory.source,
        "cache_link": cache.source,
        "link": link.source,
    }
    (remote_up, sources["remote_up"]), (remote_down, sources["remote_down"]) = remote_speeds(args, link)
    sha256_rate = sha256_bytes_per_s()
    sources["hash"] = (
        f"sha256 at {sha256_rate / 1e6:,.0f} MB/s a thread (measured here), {HASH_THREADS} threads, at most the disk's "
        f"{SERVER_LOAD_BYTES_PER_S / 1e9:g} GB/s (assumed)"
    )
    draft, sources["draft"] = draft_figures(drafted, args.draft_vocab, shape, aux_layers), draft_source
    optimizer_step_flops = draft.newton_schulz_flops if there_preflight.optimizer_step_s is None else 0.0
    samples_per_step = float(args.batch_size)
    if args.max_tokens_per_batch is not None:
        samples_per_step = min(samples_per_step, max(1.0, args.max_tokens_per_batch / args.mean_tokens))
    return Inputs(
        verifier=verifier,
        samples=args.samples,
        mean_tokens=args.mean_tokens,
        max_tokens=checked.max_tokens,
        process_tokens=process_tokens,
        captured_layers=args.layers,
        bytes_per_element=args.bytes_per_element,
        compression_ratio=compression.ratio,
        storage=compression.storage,
        storage_ratios=compression.storage_ratios,
        link_gbit=link.gbit,
        link_efficiency=link.efficiency,
        weights_link_gbit=args.weights_link_gbit or link.gbit,
        remote_up_gbit=remote_up,
        remote_down_gbit=remote_down,
        sha256_bytes_per_s=sha256_rate,
        there=there,
        here=here,
        here_share=args.here_share,
        mfu=args.mfu,
        there_tokens_per_s=there_tokens_per_s,
        here_tokens_per_s=here_tokens_per_s,
        here_usd_per_hour=args.here_usd_per_hour,
        train_tokens_per_s_per_gpu=args.train_tokens_per_s or there_preflight.train_tokens_per_s_per_gpu or block_rate,
        optimizer=args.optimizer,
        samples_per_step=samples_per_step,
        optimizer_step_s=there_preflight.optimizer_step_s,
        optimizer_step_flops=optimizer_step_flops,
        epochs=args.epochs,
        draft_vocab=args.draft_vocab,
        keep_checkpoints=args.keep_checkpoints,
        draft=draft,
        stream_buffer_gb=args.stream_buffer_gb,
        headroom=args.headroom,
        cache_link=cache.link,
        budget_usd=checked.budget_usd,
        budget_hours=checked.budget_hours,
        link_measurement=link.measurement,
        train_memory=memory,
        recompute=args.recompute,
        configured_layout=configured.layout,
        sources=sources,
        configuration=configuration,
        work=work,
        streamed_share=streamed[0],
        streamed_phases=streamed[1],
        serve_tokens_per_s=serve,
        server_start_s=args.server_start_min * 60 if args.server_start_min is not None else None,
        warnings=there_preflight.warnings
        + here_preflight.warnings
        + ([] if args.remote_down_gbit is not None else [REMOTE_DOWN_ASSUMED])
        + collect_warnings(
            verifier,
            measured,
            compression,
            compute_train_memory(memory, process_tokens, there),
            process_tokens,
            args.recompute,
            there,
            here,
            cache,
        ),
    )
