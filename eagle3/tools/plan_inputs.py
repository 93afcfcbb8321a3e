"""Where each input of `eagle3 plan` comes from: flags, presets, the project's measured metrics and DVC config, and
the verifier's own config. Every value is checked here, so a bad one ends in one error line naming its flag, and
each input that was not given says its source (`Inputs.sources`) or why it may mislead (`Inputs.warnings`)."""

import argparse
import configparser
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from eagle3.errors import Eagle3Error
from eagle3.formats.hf_config import text_config
from eagle3.paths import PROVENANCE
from eagle3.tools.plan import (
    CACHE_LINKS,
    GB,
    GPU_MEMORY_UTILIZATION,
    GPUS,
    PRESETS,
    TRAIN_MEASURED,
    Budget,
    Inputs,
    Machine,
    VerifierShape,
)

# Stored size of each extract.storage relative to bf16-lossless (raw/stored over raw/stored), measured on the
# embedded verifier's real states by benchmarks/storage_8bit.py: how a ratio measured with one storage becomes
# another's. The fp8 storages' gain depends little on the model (a fixed byte per value plus a scale per token).
STORAGE_GAIN = {"bf16-lossless": 1.0, "fp8-aux": 1.378, "fp8": 1.572, "fp8-compact": 1.774}


def verifier_shape(spec: str) -> VerifierShape:
    """A preset name, or a Hugging Face config.json (a multimodal one's `text_config` is used). The weights' size
    comes from model.safetensors.index.json beside it, else from the *.safetensors files there."""
    if spec in PRESETS:
        return PRESETS[spec]
    path = Path(spec)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise Eagle3Error(f"unknown verifier {spec!r}: not a preset ({', '.join(PRESETS)}) and no such config.json")
    try:
        config = json.loads(path.read_text())
        text = text_config(config)
        hidden, layers, vocab = int(text["hidden_size"]), int(text["num_hidden_layers"]), int(text["vocab_size"])
        intermediate = int(text.get("intermediate_size") or 4 * hidden)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise Eagle3Error(
            f"{path}: not a usable verifier config.json ({type(exc).__name__}: {exc}); it needs hidden_size, "
            "num_hidden_layers and vocab_size"
        ) from None
    weights = None
    index = path.with_name("model.safetensors.index.json")
    if index.is_file():
        try:
            weights = float(json.loads(index.read_text())["metadata"]["total_size"])
        except (OSError, ValueError, KeyError, TypeError):
            weights = None
    if weights is None:
        weights = float(sum(f.stat().st_size for f in path.parent.glob("*.safetensors"))) or None
    name = config.get("_name_or_path") or str(path.parent)
    return VerifierShape(name, hidden, layers, vocab, intermediate, None, None, weights)


def read_extract_metrics(path: Path) -> dict[str, Any]:
    try:
        metrics = json.loads(path.read_text())
        float(metrics["compression_ratio"])
    except FileNotFoundError:
        raise Eagle3Error(
            f"{path} not found: the compression ratio comes from the extract stage's metrics; run `dvc repro extract` "
            "(or `dvc pull`) or pass --compression-ratio"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise Eagle3Error(
            f"{path}: no usable compression_ratio ({type(exc).__name__}: {exc}); rerun the extract stage or pass "
            "--compression-ratio"
        ) from None
    return metrics


def measured_verifier(root: Path) -> str | None:
    """The verifier the project's metrics were measured on: the verifier stage's record (what extract read, as long
    as `dvc status` is clean). None where the project has none."""
    try:
        return str(json.loads((root / PROVENANCE).read_text())["name"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def configured_cache_link(root: Path) -> str | None:
    """The first link type of `cache.type` in the project's DVC config (config.local overrides config), the one DVC
    tries first; None where it is not set."""
    link = None
    for name in ("config", "config.local"):
        parser = configparser.ConfigParser()
        try:
            parser.read(root / ".dvc" / name)
        except configparser.Error:
            continue
        if parser.has_option("cache", "type"):
            link = parser.get("cache", "type").strip().strip("'\"").split(",")[0].strip()
    return link


def parse_budget(flag: str, text: str | None) -> Budget | None:
    """`MAX` or `MIN-MAX`, both > 0."""
    if text is None:
        return None
    try:
        parts = [float(part) for part in text.replace("$", "").split("-")]
    except ValueError:
        parts = []
    if len(parts) not in (1, 2) or not all(math.isfinite(p) and p > 0 for p in parts) or parts != sorted(parts):
        raise Eagle3Error(f"{flag}: expected MAX or MIN-MAX with 0 < MIN <= MAX, got {text!r}")
    return Budget(parts[0] if len(parts) == 2 else None, parts[-1])


def _positive(name: str, value: float | None, allow_zero: bool = False) -> None:
    if value is None:
        return
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise Eagle3Error(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value:g}")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _gpu(flag: str, name: str) -> str:
    if name not in GPUS:
        raise Eagle3Error(f"{flag}: unknown GPU {name!r}; presets: {', '.join(GPUS)}")
    return name


def _check_values(args: argparse.Namespace) -> None:
    for name in (
        "samples",
        "mean_tokens",
        "max_tokens",
        "layers",
        "bytes_per_element",
        "link_gbit",
        "link_efficiency",
        "weights_link_gbit",
        "extract_tokens_per_s",
        "gpus",
        "gpu_tflops",
        "mfu",
        "here_gpus",
        "here_share",
        "here_tokens_per_s",
        "train_tokens_per_s",
        "epochs",
        "draft_vocab",
        "keep_checkpoints",
        "disk_tb",
        "here_disk_tb",
        "compression_ratio",
        "active_params",
        "weights_gb",
        "probe_mb",
        "jobs",
    ):
        _positive(_flag(name), getattr(args, name))
    for name in ("gpu_usd_per_hour", "here_usd_per_hour", "headroom"):
        _positive(_flag(name), getattr(args, name), allow_zero=True)
    for name in ("link_efficiency", "mfu", "here_share"):
        if getattr(args, name) > 1:
            raise Eagle3Error(f"{_flag(name)} is a fraction in (0, 1], got {getattr(args, name):g}")
    if args.compression_ratio is not None and args.compression_ratio <= 1:
        raise Eagle3Error(
            f"--compression-ratio is raw/stored and must be > 1 (the shards are compressed), got "
            f"{args.compression_ratio:g}"
        )
    if args.cache_link is not None and args.cache_link not in CACHE_LINKS:
        raise Eagle3Error(f"--cache-link: unknown link type {args.cache_link!r}; one of {', '.join(CACHE_LINKS)}")


def inputs_from_args(args: argparse.Namespace, root: Path) -> Inputs:
    _check_values(args)
    mean_tokens = args.mean_tokens
    max_tokens = args.max_tokens if args.max_tokens is not None else int(math.ceil(mean_tokens))
    if mean_tokens > max_tokens:
        raise Eagle3Error(f"--mean-tokens ({mean_tokens:g}) cannot exceed --max-tokens ({max_tokens})")
    there_gpu, here_gpu = _gpu("--gpu", args.gpu), _gpu("--here-gpu", args.here_gpu)
    budget_usd = parse_budget("--budget-usd", args.budget_usd)
    budget_hours = parse_budget("--budget-hours", args.budget_hours)

    verifier = verifier_shape(args.verifier)
    if args.active_params is not None:
        verifier = replace(verifier, active_params=args.active_params)
    if args.weights_gb is not None:
        verifier = replace(verifier, weights_bytes=args.weights_gb * GB)
    if verifier.weights_bytes is None:
        raise Eagle3Error(
            f"verifier {args.verifier!r}: weights size unknown (no safetensors beside its config.json): pass "
            "--weights-gb"
        )
    derives_extraction = args.extract_tokens_per_s is None or args.here_tokens_per_s is None
    if derives_extraction and verifier.active_params is None:
        raise Eagle3Error(
            f"verifier {args.verifier!r} has no parameter count: pass --active-params to derive extraction speeds "
            "from GPU FLOP/s, or --extract-tokens-per-s and --here-tokens-per-s"
        )
    sources = {"verifier": args.verifier}
    warnings: list[str] = []

    metrics_path = root / args.metrics
    measured_on = measured_verifier(root)
    same_verifier = measured_on == verifier.name
    wanted = args.compression_ratio is None or (same_verifier and metrics_path.is_file())
    metrics = read_extract_metrics(metrics_path) if wanted else None
    measured_storage = metrics.get("storage", "bf16-lossless") if metrics else None
    storage = args.storage or measured_storage or "bf16-lossless"
    ratio = args.compression_ratio
    sources["compression_ratio"] = f"--compression-ratio (storage {storage})"
    if ratio is None:
        ratio = float(metrics["compression_ratio"])
        _positive(f"{args.metrics}: compression_ratio", ratio)
        sources["compression_ratio"] = (
            f"{args.metrics}, measured with storage {measured_storage} on {measured_on or 'an unrecorded verifier'}"
        )
        if storage != measured_storage:
            factor = STORAGE_GAIN[storage] / STORAGE_GAIN[measured_storage]
            ratio *= factor
            sources["compression_ratio"] += f", x{factor:.3f} for {storage} (benchmarks/storage_8bit.py)"
        if not same_verifier:
            warnings.append(
                f"the compression ratio {ratio:g} was measured on {measured_on or 'an unrecorded verifier'}'s states, "
                f"not {verifier.name}'s; split-byte zstd of bf16 states should carry over (README), but measure it "
                "on a few real samples and pass --compression-ratio"
            )

    storage_ratios = {name: ratio * gain / STORAGE_GAIN[storage] for name, gain in STORAGE_GAIN.items()}

    there = Machine(
        there_gpu,
        args.gpus,
        args.gpu_tflops or GPUS[there_gpu].bf16_tflops,
        GPUS[there_gpu].usd_per_hour if args.gpu_usd_per_hour is None else args.gpu_usd_per_hour,
        args.disk_tb,
    )
    here = Machine(here_gpu, args.here_gpus, GPUS[here_gpu].bf16_tflops, 0.0, args.here_disk_tb)
    sources["there"] = (
        f"{there.gpus} x {GPUS[there_gpu].name}: {there.tflops:g} TFLOP/s, {there.memory_gb:g} GB, "
        f"${there.usd_per_gpu_hour:g}/GPU-hour" + (" (preset)" if args.gpu_usd_per_hour is None else "")
    )
    sources["here"] = f"{here.gpus} x {GPUS[here_gpu].name}: {here.tflops:g} TFLOP/s, {here.memory_gb:g} GB"
    sources["extract_there"] = (
        "--extract-tokens-per-s"
        if args.extract_tokens_per_s is not None
        else f"derived: {there.gpus} GPUs x {there.tflops:g} TFLOP/s x MFU {args.mfu:g}"
    )

    here_tps = args.here_tokens_per_s
    sources["extract_here"] = "--here-tokens-per-s"
    if here_tps is None:
        measured = (metrics.get("this_run") or {}).get("tokens_per_s") if same_verifier and metrics else None
        if isinstance(measured, (int, float)) and measured > 0:
            here_tps = float(measured)
            sources["extract_here"] = f"{args.metrics} this_run.tokens_per_s, measured here on {measured_on}"
        else:
            sources["extract_here"] = (
                f"derived: {here.gpus} GPUs x {here.tflops:g} TFLOP/s x MFU {args.mfu:g} x share {args.here_share:g}"
                + (f" (the measured rate is {measured_on}'s, not this verifier's)" if measured_on else "")
            )

    train_per_gpu = args.train_tokens_per_s
    sources["train"] = (
        "--train-tokens-per-s per GPU"
        if train_per_gpu is not None
        else f"measured {TRAIN_MEASURED.tokens_per_s:,.0f} tokens/s on one {GPUS[TRAIN_MEASURED.gpu].name} "
        f"({TRAIN_MEASURED.sample_tokens:,}-token samples, {TRAIN_MEASURED.ttt_steps} TTT steps) x "
        f"{there.tflops:g} / {GPUS[TRAIN_MEASURED.gpu].bf16_tflops:g} TFLOP/s, {there.gpus} GPUs"
    )
    # The quadratic trainer's measured limit, scaled by memory as its T x T attention was: the linear-memory one
    # (eagle3/modeling/attention.py) has not been measured on a GPU yet, so a longer sample is flagged, not refused.
    measured_gpu = GPUS[TRAIN_MEASURED.gpu]
    fitting = int(TRAIN_MEASURED.longest_fitting_tokens * math.sqrt(there.memory_gb / measured_gpu.memory_gb))
    if max_tokens > fitting:
        warnings.append(
            f"samples of {max_tokens:,} tokens: training memory is now linear in length but not yet measured on a "
            f"GPU; the quadratic trainer before it fitted at most {TRAIN_MEASURED.longest_fitting_tokens:,} tokens x "
            f"{TRAIN_MEASURED.ttt_steps} TTT steps in an {measured_gpu.name}'s {measured_gpu.memory_gb:g} GB "
            f"(~{fitting:,} in {there.memory_gb:g} GB). Run `python benchmarks/train_gpu.py --tokens {max_tokens}` "
            "on one GPU of the rented kind before booking (train.activation_checkpointing and "
            "train.max_tokens_per_batch bound the memory)"
        )
    for side, machine in (("here", here), ("there", there)):
        if verifier.weights_bytes > machine.gpus * machine.memory_gb * GB * GPU_MEMORY_UTILIZATION:
            warnings.append(
                f"the verifier's {verifier.weights_bytes / GB:,.0f} GB of weights do not fit {side} "
                f"({machine.gpus} x {machine.memory_gb:g} GB x {GPU_MEMORY_UTILIZATION}); check "
                + ("--here-gpu/--here-gpus" if side == "here" else "--gpu/--gpus")
            )

    cache_link = args.cache_link
    sources["cache_link"] = "--cache-link"
    if cache_link is None:
        configured = configured_cache_link(root)
        if configured in CACHE_LINKS:
            cache_link, sources["cache_link"] = configured, "this project's DVC config (cache.type)"
        else:
            cache_link, sources["cache_link"] = "hardlink", "assumed: the README's `cache.type hardlink,symlink`"
            warnings.append(
                "DVC's default cache type (reflink,copy) copies on ext4, storing every output twice: run "
                "`dvc config --local cache.type hardlink,symlink` on both machines (--cache-link copy shows the cost)"
            )

    link_gbit, link_efficiency, measurement = args.link_gbit, args.link_efficiency, None
    sources["link"] = "--link-gbit x --link-efficiency"
    if args.link_from_remote:
        from eagle3.tools.remotes import measure_upload

        measurement = measure_upload(root, args.link_from_remote, int(args.probe_mb * 1e6), args.jobs)
        link_gbit, link_efficiency = measurement["parallel_gbit"], 1.0
        sources["link"] = (
            f"measured: {args.probe_mb:g} MB to DVC remote {args.link_from_remote!r}, one stream "
            f"{measurement['single_gbit']:.3g} Gbit/s, {measurement['jobs']} streams {measurement['parallel_gbit']:.3g}"
            " Gbit/s (used: `dvc push --jobs` runs as many)"
        )

    return Inputs(
        verifier=verifier,
        samples=args.samples,
        mean_tokens=mean_tokens,
        max_tokens=max_tokens,
        captured_layers=args.layers,
        bytes_per_element=args.bytes_per_element,
        compression_ratio=ratio,
        storage=storage,
        storage_ratios=storage_ratios,
        link_gbit=link_gbit,
        link_efficiency=link_efficiency,
        weights_link_gbit=args.weights_link_gbit or link_gbit,
        there=there,
        here=here,
        here_share=args.here_share,
        mfu=args.mfu,
        there_tokens_per_s=args.extract_tokens_per_s,
        here_tokens_per_s=here_tps,
        here_usd_per_hour=args.here_usd_per_hour,
        train_tokens_per_s_per_gpu=train_per_gpu,
        epochs=args.epochs,
        draft_vocab=args.draft_vocab,
        keep_checkpoints=args.keep_checkpoints,
        headroom=args.headroom,
        cache_link=cache_link,
        budget_usd=budget_usd,
        budget_hours=budget_hours,
        link_measurement=measurement,
        sources=sources,
        warnings=warnings,
    )
