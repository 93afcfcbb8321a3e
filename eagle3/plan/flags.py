"""`eagle3 plan`'s flags: declared (each help naming its default, the params.yaml key where one decides it), then
each checked on its own before any file is read: a bad value (not finite, out of range, past what any machine or
run has) is one error line naming the flag."""

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

from eagle3.errors import Eagle3Error
from eagle3.formats.storage import STORAGES
from eagle3.gpu_kinds import GPUS
from eagle3.params.train import MAX_TTT_STEPS, RECOMPUTE, DraftLayout, Optimizer, Sharding
from eagle3.paths import EXTRACT_METRICS
from eagle3.plan.configured import CONFIGURED, FALLBACK, RUN_INPUTS, SHIPPED
from eagle3.plan.facts import CACHE_LINKS, PRESETS, Budget

# The link between here and the rented machine where no flag gives it: a common office uplink, and the share of it
# a transfer reaches (benchmarks/transfer.py measures one).
LINK_GBIT = 5.0
LINK_EFFICIENCY = 0.8


def _configured(flag: str) -> str:
    """The default a help text names: the params key, else the shipped configuration's (or the fallback)."""
    key = CONFIGURED[flag]
    if flag in RUN_INPUTS:
        return f"default: params.yaml {key}"
    return f"default: params.yaml {key}, else the shipped {SHIPPED} configuration's" + (
        f" (or {FALLBACK[flag]})" if flag in FALLBACK else ""
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Disk, time and cost of the hero run before renting: extract here and ship the states (A), extract on the "
        "rented machine (B) or stream them there (C). Every setting params.yaml decides is read from it (a flag "
        "overrides it); the answer names each input's source."
    )
    data = parser.add_argument_group("data")
    data.add_argument(
        "--verifier",
        help=f"preset ({', '.join(PRESETS)}) or a config.json / model dir (default: params.yaml's verifier: a "
        "preset, its directory here or the verifier stage's copy; kimi-k2.5 where no params file names one)",
    )
    data.add_argument("--samples", type=int, help=f"training samples (conversations; {_configured('samples')})")
    data.add_argument(
        "--mean-tokens",
        type=float,
        help="mean tokens per sample (default: as generate measured them on this verifier: prompt and answer tokens "
        "per assistant turn, metrics/generate.json)",
    )
    data.add_argument(
        "--max-tokens", type=int, help=f"longest sample in tokens ({_configured('max_tokens')}, else the mean)"
    )
    data.add_argument(
        "--layers", type=int, help=f"captured layers: aux layers + the final one ({_configured('layers')})"
    )
    data.add_argument("--bytes-per-element", type=int, default=2, help="2 for bf16 (default)")
    data.add_argument(
        "--compression-ratio",
        type=float,
        help="raw/stored bytes, > 1 (default: compression_ratio in --metrics, with a warning when it was measured "
        "on another verifier)",
    )
    data.add_argument(
        "--storage",
        choices=list(STORAGES),
        help="extract.storage the plan assumes (default: params.yaml extract.storage, else the one --metrics was "
        "measured with); every storage is shown beside it",
    )
    data.add_argument(
        "--metrics",
        type=Path,
        help=f"the extract stage's metrics (default: the project's {EXTRACT_METRICS.as_posix()})",
    )
    link = parser.add_argument_group("link between here and the rented machine")
    link.add_argument("--link-gbit", type=float, help=f"line rate, Gbit/s (default {LINK_GBIT:g})")
    link.add_argument(
        "--link-efficiency",
        type=float,
        help=f"share of the line rate a transfer reaches (default {LINK_EFFICIENCY:g}; benchmarks/transfer.py "
        "measures it)",
    )
    link.add_argument(
        "--link-from-remote",
        metavar="REMOTE",
        help="measure the link instead: upload to this DVC remote with DVC's own transport, one and --jobs streams",
    )
    link.add_argument("--jobs", type=int, help="parallel streams of that upload (default: the remote's, as dvc push)")
    link.add_argument("--probe-mb", type=float, default=256.0, help="size of that upload, MB (default 256)")
    link.add_argument(
        "--weights-link-gbit",
        type=float,
        help="Gbit/s at which the rented machine gets the verifier weights (default: --link-gbit)",
    )
    remote = parser.add_argument_group(
        "the DVC remote (docs/hero-run.md moves the text, A's hidden states and the checkpoints through it)"
    )
    remote.add_argument(
        "--remote-up-gbit",
        type=float,
        help="Gbit/s a `dvc push` here reaches to the remote, before renting (default: --link-from-remote's "
        "measurement, else the link)",
    )
    remote.add_argument(
        "--remote-down-gbit",
        type=float,
        help="Gbit/s the rented machine reaches to and from the remote (`dvc pull` of the states in A, `dvc push` of "
        "the checkpoints; default: the link, assumed; `eagle3 preflight` there can't measure it before renting, a "
        "provider's figure or a test machine can)",
    )
    there = parser.add_argument_group("the rented machine")
    there.add_argument("--gpu", help=f"GPU preset: {', '.join(GPUS)} ({_configured('gpu')})")
    there.add_argument("--gpus", type=int, help=f"GPUs, one training process each ({_configured('gpus')})")
    there.add_argument("--gpu-tflops", type=float, help="dense bf16 TFLOP/s per GPU (default: the preset's)")
    there.add_argument("--gpu-usd-per-hour", type=float, help="price per GPU-hour (default: the preset's)")
    there.add_argument("--disk-tb", type=float, help="its disk, TB (default: unknown; the plan says what it needs)")
    there.add_argument(
        "--extract-tokens-per-s", type=float, help="extraction speed there (default: derived from FLOP/s)"
    )
    there.add_argument(
        "--mfu", type=float, default=0.3, help="model FLOP utilisation of extraction, both machines (default 0.3)"
    )
    here = parser.add_argument_group("this machine (serves the verifier, generates the data)")
    here.add_argument("--here-gpu", default="h200-nvl", help="its GPU preset (default h200-nvl, a PCIe card)")
    here.add_argument("--here-gpus", type=int, default=8, help="its GPUs (default 8)")
    here.add_argument(
        "--here-share",
        type=float,
        default=1.0,
        help="share of its GPU time extraction gets (default 1: the server is stopped while extracting)",
    )
    here.add_argument(
        "--here-tokens-per-s",
        type=float,
        help="extraction speed here (default: measured in --metrics when on this verifier, else derived)",
    )
    here.add_argument(
        "--here-usd-per-hour", type=float, default=0.0, help="cost of an hour of extraction here (default 0: owned)"
    )
    here.add_argument(
        "--serve-tokens-per-s",
        type=float,
        help="output tokens/s of the verifier's server here, for generate and (scaled to the rented GPUs) evaluate "
        "(default: what generate measured on this verifier, else an assumption per GPU)",
    )
    here.add_argument(
        "--server-start-min",
        type=float,
        help="minutes to start the verifier, a server or an engine (default: its weights at 2 GB/s plus 1 min)",
    )
    here.add_argument(
        "--here-disk-tb", type=float, help="its data volume, TB (default: --here-preflight's free space, else 3)"
    )
    measured = parser.add_argument_group("measured by `eagle3 preflight` (explicit flags above still win)")
    measured.add_argument(
        "--preflight",
        type=Path,
        metavar="FILE",
        help="the rented machine's preflight report: its training and extraction rates, compression ratio, free disk",
    )
    measured.add_argument(
        "--here-preflight", type=Path, metavar="FILE", help="this machine's preflight report: extraction rate, disk"
    )
    training = parser.add_argument_group("training, disk layout and budget")
    training.add_argument("--epochs", type=int, help=f"epochs ({_configured('epochs')})")
    training.add_argument(
        "--train-tokens-per-s",
        type=float,
        help="draft training speed per GPU (default: the measured H200 figure scaled by TFLOP/s)",
    )
    training.add_argument("--draft-vocab", type=int, help=f"draft vocabulary ({_configured('draft_vocab')})")
    training.add_argument(
        "--ttt-steps", type=int, help=f"training-time test depth, for the training memory ({_configured('ttt_steps')})"
    )
    training.add_argument(
        "--sharding",
        choices=list(get_args(Sharding)),
        help=f"for the training memory per GPU ({_configured('sharding')})",
    )
    training.add_argument(
        "--draft-layout",
        type=draft_layout,
        metavar="NORMS",
        help="the draft layout's norms, comma-separated (fc_norm, norm_before_fc, norm_output, norm_before_residual) "
        f"or none, for the training memory ({_configured('draft_layout')})",
    )
    training.add_argument(
        "--recompute",
        choices=list(RECOMPUTE),
        help=f"train.activation_checkpointing the memory check holds to ({_configured('recompute')})",
    )
    training.add_argument(
        "--optimizer",
        choices=list(get_args(Optimizer)),
        help=f"train.optimizer, for the training time and memory ({_configured('optimizer')})",
    )
    training.add_argument(
        "--batch-size", type=int, help=f"sequences per optimizer step, over all GPUs ({_configured('batch_size')})"
    )
    training.add_argument(
        "--max-tokens-per-batch",
        type=int,
        help=f"padded tokens per optimizer step, over all GPUs ({_configured('max_tokens_per_batch')})",
    )
    training.add_argument(
        "--keep-checkpoints", type=int, help=f"resumable checkpoints kept on disk ({_configured('keep_checkpoints')})"
    )
    training.add_argument(
        "--stream-buffer-gb",
        type=float,
        help=f"the streamed layout's (C) only disk for states ({_configured('stream_buffer_gb')})",
    )
    training.add_argument(
        "--headroom", type=float, default=0.2, help="free-space margin on top of everything, fraction (default 0.2)"
    )
    training.add_argument(
        "--cache-link",
        help=f"DVC cache link type: {', '.join(CACHE_LINKS)} (default: this project's cache.type, else hardlink)",
    )
    training.add_argument("--budget-usd", help="rented-machine budget, MAX or MIN-MAX dollars (e.g. 180-900)")
    training.add_argument("--budget-hours", help="rented hours, MAX or MIN-MAX (e.g. 6-18)")
    training.add_argument("--active-params", type=float, help="verifier parameters active per token (presets know it)")
    training.add_argument(
        "--weights-gb", type=float, help="verifier weights on disk, GB (presets and safetensors indexes know it)"
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON instead of tables")


def draft_layout(text: str) -> tuple[str, ...]:
    """--draft-layout: switch names of train.draft_layout, comma-separated, or none."""
    names = tuple(name.strip() for name in text.split(",") if name.strip() and name.strip() != "none")
    unknown = [name for name in names if name not in DraftLayout.model_fields]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"{', '.join(unknown)}: not a draft layout switch; use {', '.join(DraftLayout.model_fields)} or none"
        )
    return tuple(name for name in DraftLayout.model_fields if name in names)


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


def positive(name: str, value: float | None, allow_zero: bool = False) -> None:
    if value is None:
        return
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise Eagle3Error(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value:g}")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _check_gpu(flag: str, name: str) -> None:
    if name not in GPUS:
        raise Eagle3Error(f"{flag}: unknown GPU {name!r}; presets: {', '.join(GPUS)}")


# Flags (as attribute names) that must be > 0 where given, in the order their errors take precedence.
POSITIVE = (
    "samples mean_tokens max_tokens layers bytes_per_element link_gbit link_efficiency weights_link_gbit "
    "remote_up_gbit remote_down_gbit "
    "extract_tokens_per_s gpus gpu_tflops mfu here_gpus here_share here_tokens_per_s train_tokens_per_s epochs "
    "draft_vocab keep_checkpoints stream_buffer_gb disk_tb here_disk_tb compression_ratio active_params weights_gb "
    "probe_mb jobs ttt_steps serve_tokens_per_s server_start_min batch_size max_tokens_per_batch"
).split()


# Upper bounds: past them a flag describes no machine or run (and would overflow a figure or estimate forever).
LIMITS = {
    "samples": 1e10,
    "mean_tokens": 1e8,
    "max_tokens": 1e8,
    "layers": 1000,
    "bytes_per_element": 8,
    "link_gbit": 1e6,
    "weights_link_gbit": 1e6,
    "remote_up_gbit": 1e6,
    "remote_down_gbit": 1e6,
    "extract_tokens_per_s": 1e12,
    "here_tokens_per_s": 1e12,
    "train_tokens_per_s": 1e12,
    "gpus": 100_000,
    "here_gpus": 100_000,
    "gpu_tflops": 1e7,
    "epochs": 10_000,
    "draft_vocab": 1e8,
    "keep_checkpoints": 10_000,
    "stream_buffer_gb": 1e9,
    "disk_tb": 1e6,
    "here_disk_tb": 1e6,
    "compression_ratio": 1000,
    "active_params": 1e15,
    "weights_gb": 1e9,
    "probe_mb": 1e6,
    "jobs": 1024,
    "ttt_steps": MAX_TTT_STEPS,
    "gpu_usd_per_hour": 1e6,
    "here_usd_per_hour": 1e9,
    "headroom": 100,
    "serve_tokens_per_s": 1e12,
    "server_start_min": 1e6,
    "batch_size": 1e8,
    "max_tokens_per_batch": 1e12,
}


def _check_values(args: argparse.Namespace) -> None:
    for name in POSITIVE:
        positive(_flag(name), getattr(args, name))
    for name, limit in LIMITS.items():
        value = getattr(args, name)
        if value is not None and value > limit:
            raise Eagle3Error(f"{_flag(name)} must be <= {limit:g}, got {value:g}")
    for name in ("gpu_usd_per_hour", "here_usd_per_hour", "headroom"):
        positive(_flag(name), getattr(args, name), allow_zero=True)
    for name in ("link_efficiency", "mfu", "here_share"):
        if getattr(args, name) is not None and getattr(args, name) > 1:
            raise Eagle3Error(f"{_flag(name)} is a fraction in (0, 1], got {getattr(args, name):g}")
    if args.compression_ratio is not None and args.compression_ratio <= 1:
        raise Eagle3Error(
            f"--compression-ratio is raw/stored and must be > 1 (the shards are compressed), got "
            f"{args.compression_ratio:g}"
        )
    if args.cache_link is not None and args.cache_link not in CACHE_LINKS:
        raise Eagle3Error(f"--cache-link: unknown link type {args.cache_link!r}; one of {', '.join(CACHE_LINKS)}")


@dataclass(frozen=True)
class CheckedArgs:
    """What the flags give once checked: the longest sample (default: the mean, rounded up) and the budgets."""

    max_tokens: int
    budget_usd: Budget | None
    budget_hours: Budget | None


def validate_args(args: argparse.Namespace, configuration: dict[str, str] | None = None) -> CheckedArgs:
    """Every flag on its own, before any file but the params is read, so that the first bad one is the error
    reported."""
    _check_values(args)
    # Whether the link's two figures were given, for their source; then their defaults.
    args.link_gbit_given, args.link_efficiency_given = args.link_gbit is not None, args.link_efficiency is not None
    args.link_gbit = LINK_GBIT if args.link_gbit is None else args.link_gbit
    args.link_efficiency = LINK_EFFICIENCY if args.link_efficiency is None else args.link_efficiency
    max_tokens = args.max_tokens if args.max_tokens is not None else int(math.ceil(args.mean_tokens))
    if args.mean_tokens > max_tokens:
        source = (configuration or {}).get("max_tokens", "--max-tokens")
        raise Eagle3Error(
            f"--mean-tokens ({args.mean_tokens:g}) cannot exceed the longest sample, {max_tokens} tokens ({source})"
        )
    _check_gpu("--gpu", args.gpu)
    _check_gpu("--here-gpu", args.here_gpu)
    if args.optimizer == "muon" and args.sharding == "fsdp":
        sources = configuration or {}
        raise Eagle3Error(
            f"optimizer muon ({sources.get('optimizer', '--optimizer')}) orthogonalises whole matrices, which "
            f"sharding fsdp ({sources.get('sharding', '--sharding')}) splits over the GPUs: plan --optimizer adamw "
            "or --sharding ddp"
        )
    return CheckedArgs(
        max_tokens, parse_budget("--budget-usd", args.budget_usd), parse_budget("--budget-hours", args.budget_hours)
    )
