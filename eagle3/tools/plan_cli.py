"""`eagle3 plan`: its command-line flags, where each input comes from, and the printed plan (table or JSON).
The formulas are eagle3/tools/plan.py's."""

import argparse
import json
import math
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from eagle3.errors import Eagle3Error
from eagle3.paths import EXTRACT_METRICS
from eagle3.tools.plan import GB, PRESETS, TB, Inputs, VerifierShape, compute, verifier_shape


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


def _positive(name: str, value: float | None, allow_zero: bool = False) -> None:
    if value is None:
        return
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise Eagle3Error(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value:g}")


def inputs_from_args(args: argparse.Namespace) -> Inputs:
    for flag in (
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
        "here_tokens_per_s",
        "epochs",
        "draft_vocab",
        "keep_checkpoints",
        "disk_tb",
        "compression_ratio",
    ):
        _positive("--" + flag.replace("_", "-"), getattr(args, flag))
    for flag in ("gpu_usd_per_hour", "here_usd_per_hour", "headroom"):
        _positive("--" + flag.replace("_", "-"), getattr(args, flag), allow_zero=True)
    for flag in ("link_efficiency", "mfu"):
        if getattr(args, flag) > 1:
            raise Eagle3Error(f"--{flag.replace('_', '-')} is a fraction in (0, 1], got {getattr(args, flag):g}")
    mean_tokens = args.mean_tokens
    max_tokens = args.max_tokens if args.max_tokens is not None else int(math.ceil(mean_tokens))
    if mean_tokens > max_tokens:
        raise Eagle3Error(f"--mean-tokens ({mean_tokens:g}) cannot exceed --max-tokens ({max_tokens})")
    if args.compression_ratio is not None and args.compression_ratio < 1:
        raise Eagle3Error(f"--compression-ratio is raw/stored and cannot be below 1, got {args.compression_ratio:g}")

    verifier = verifier_shape(args.verifier)
    sources = {"verifier": args.verifier}
    metrics: dict[str, Any] | None = None
    if args.compression_ratio is None or args.here_tokens_per_s is None:
        if args.compression_ratio is None or Path(args.metrics).is_file():
            metrics = read_extract_metrics(Path(args.metrics))
    ratio = args.compression_ratio
    sources["compression_ratio"] = "--compression-ratio"
    if ratio is None:
        ratio = float(metrics["compression_ratio"])
        sources["compression_ratio"] = f"{args.metrics} (measured by the extract stage)"
        _positive(f"{args.metrics}: compression_ratio", ratio)
    here_tps = args.here_tokens_per_s
    sources["here_tokens_per_s"] = "--here-tokens-per-s" if here_tps is not None else "unknown"
    if here_tps is None and metrics is not None:
        measured = (metrics.get("this_run") or {}).get("tokens_per_s")
        if isinstance(measured, (int, float)) and measured > 0:
            here_tps = float(measured)
            sources["here_tokens_per_s"] = f"{args.metrics} this_run.tokens_per_s (this machine's last extract run)"
    if args.here_usd_per_hour > 0 and here_tps is None:
        raise Eagle3Error(
            "--here-usd-per-hour needs the extraction speed here: pass --here-tokens-per-s (or run the extract stage "
            "here once)"
        )

    target_tps = args.extract_tokens_per_s
    sources["target_tokens_per_s"] = "--extract-tokens-per-s"
    if target_tps is None:
        if verifier.active_params is None and args.active_params is None:
            raise Eagle3Error(
                f"verifier {args.verifier!r} has no parameter count: pass --extract-tokens-per-s, or --active-params "
                "to derive it from GPU FLOP/s"
            )
        sources["target_tokens_per_s"] = f"derived: {args.gpus} GPUs x {args.gpu_tflops:g} TFLOP/s x MFU {args.mfu:g}"
    if args.active_params is not None:
        _positive("--active-params", args.active_params)
        verifier = VerifierShape(**{**asdict(verifier), "active_params": args.active_params})
    if args.weights_gb is not None:
        _positive("--weights-gb", args.weights_gb)
        verifier = VerifierShape(**{**asdict(verifier), "weights_bytes": args.weights_gb * GB})
    if verifier.weights_bytes is None:
        raise Eagle3Error(
            f"verifier {args.verifier!r}: weights size unknown (no safetensors beside its config.json): pass "
            "--weights-gb"
        )

    _positive("--probe-mb", args.probe_mb)
    link_gbit, link_efficiency = args.link_gbit, args.link_efficiency
    sources["link"] = "--link-gbit x --link-efficiency"
    if args.link_from_remote:
        from eagle3.tools.remotes import measure_upload

        link_gbit = measure_upload(Path.cwd(), args.link_from_remote, int(args.probe_mb * 1e6)) * 8 / 1e9
        link_efficiency = 1.0
        sources["link"] = f"measured: one {args.probe_mb:g} MB upload to DVC remote {args.link_from_remote!r}"

    return Inputs(
        verifier=verifier,
        samples=args.samples,
        mean_tokens=mean_tokens,
        max_tokens=max_tokens,
        captured_layers=args.layers,
        bytes_per_element=args.bytes_per_element,
        compression_ratio=ratio,
        link_gbit=link_gbit,
        link_efficiency=link_efficiency,
        weights_link_gbit=args.weights_link_gbit or link_gbit,
        target_tokens_per_s=target_tps,
        gpus=args.gpus,
        gpu_tflops=args.gpu_tflops,
        mfu=args.mfu,
        gpu_usd_per_hour=args.gpu_usd_per_hour,
        here_tokens_per_s=here_tps,
        here_usd_per_hour=args.here_usd_per_hour,
        epochs=args.epochs,
        draft_vocab=args.draft_vocab,
        keep_checkpoints=args.keep_checkpoints,
        headroom=args.headroom,
        disk_tb=args.disk_tb,
        sources=sources,
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    data = parser.add_argument_group("data")
    data.add_argument(
        "--verifier",
        default="kimi-k2.5",
        help=f"preset ({', '.join(PRESETS)}) or a config.json / model dir (default kimi-k2.5)",
    )
    data.add_argument("--samples", type=int, required=True, help="training samples (conversations)")
    data.add_argument("--mean-tokens", type=float, required=True, help="mean tokens per sample")
    data.add_argument("--max-tokens", type=int, help="longest sample in tokens (default: the mean)")
    data.add_argument("--layers", type=int, default=4, help="captured layers: aux layers + the final one (default 4)")
    data.add_argument("--bytes-per-element", type=int, default=2, help="2 for bf16 (default)")
    data.add_argument(
        "--compression-ratio", type=float, help="raw/stored bytes (default: compression_ratio in --metrics)"
    )
    data.add_argument(
        "--metrics",
        default=EXTRACT_METRICS.as_posix(),
        help=f"the extract stage's metrics (default {EXTRACT_METRICS.as_posix()})",
    )
    machines = parser.add_argument_group("link and machines")
    machines.add_argument(
        "--link-gbit", type=float, default=5.0, help="link between here and the rented machine, Gbit/s (default 5)"
    )
    machines.add_argument(
        "--link-efficiency",
        type=float,
        default=0.8,
        help="share of the line rate a transfer reaches (default 0.8; benchmarks/transfer.py measures it)",
    )
    machines.add_argument(
        "--link-from-remote",
        metavar="REMOTE",
        help="measure the link instead: time an upload to this DVC remote with DVC's own transport",
    )
    machines.add_argument("--probe-mb", type=float, default=256.0, help="size of that upload, MB (default 256)")
    machines.add_argument(
        "--weights-link-gbit",
        type=float,
        help="Gbit/s at which the rented machine gets the verifier weights (default: --link-gbit)",
    )
    machines.add_argument(
        "--extract-tokens-per-s",
        type=float,
        help="extraction speed on the rented machine (default: derived from FLOP/s)",
    )
    machines.add_argument("--active-params", type=float, help="verifier parameters active per token (presets know it)")
    machines.add_argument(
        "--weights-gb", type=float, help="verifier weights on disk, GB (presets and safetensors indexes know it)"
    )
    machines.add_argument("--gpus", type=int, default=8, help="GPUs on the rented machine (default 8)")
    machines.add_argument(
        "--gpu-tflops", type=float, default=989.0, help="dense bf16 TFLOP/s per GPU (default 989, H100 SXM)"
    )
    machines.add_argument(
        "--mfu", type=float, default=0.3, help="model FLOP utilisation of extraction (prefill only; default 0.3)"
    )
    machines.add_argument("--gpu-usd-per-hour", type=float, default=2.5, help="rented price per GPU-hour (default 2.5)")
    machines.add_argument(
        "--here-tokens-per-s", type=float, help="extraction speed here (default: this_run.tokens_per_s in --metrics)"
    )
    machines.add_argument(
        "--here-usd-per-hour", type=float, default=0.0, help="cost of an hour of extraction here (default 0: owned)"
    )
    training = parser.add_argument_group("training")
    training.add_argument(
        "--epochs", type=int, default=4, help="epochs; online training reruns the verifier in each (default 4)"
    )
    training.add_argument("--draft-vocab", type=int, default=32000, help="draft vocabulary (default 32000)")
    training.add_argument(
        "--keep-checkpoints", type=int, default=3, help="resumable checkpoints kept on disk (default 3)"
    )
    training.add_argument(
        "--headroom", type=float, default=0.2, help="free-space margin on top of everything, fraction (default 0.2)"
    )
    training.add_argument(
        "--disk-tb", type=float, help="rented machine's disk, TB: scenarios that do not fit are ruled out"
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON instead of a table")


def _size(value: float | None) -> str:
    if value is None:
        return "n/a"
    if value >= TB:
        return f"{value / TB:,.2f} TB"
    return f"{value / GB:,.1f} GB" if value >= GB else f"{value / 1e6:,.1f} MB"


def _hours(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    return f"{seconds / 3600:,.1f} h" if seconds >= 3600 else f"{seconds / 60:,.1f} min"


def render(plan: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    # A pipe gets 80 columns by default, which folds the scenario table into unreadable cells.
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 132)
    inputs, v = plan["inputs"], plan["inputs"]["verifier"]
    console.print(
        f"[bold]{v['name']}[/bold]: hidden {v['hidden_size']}, {v['num_layers']} layers, vocab {v['vocab_size']}; "
        f"{inputs['samples']:,} samples x {inputs['mean_tokens']:,.0f} tokens = {plan['tokens']:,.0f} tokens"
    )
    sizes = Table(title="Disk", title_justify="left")
    sizes.add_column("item")
    sizes.add_column("size", justify="right")
    sizes.add_column("how")
    hidden = plan["hidden_states"]
    sizes.add_row(
        "bytes per token",
        f"{plan['bytes_per_token']:,} B",
        f"{inputs['captured_layers']} layers x {v['hidden_size']} x {inputs['bytes_per_element']} B",
    )
    sizes.add_row("hidden states, raw", _size(hidden["raw_bytes"]), "tokens x bytes per token")
    sizes.add_row(
        "hidden states, stored",
        _size(hidden["stored_bytes"]),
        f"raw / {inputs['compression_ratio']:g} ({inputs['sources']['compression_ratio']})",
    )
    sizes.add_row("largest sample", _size(hidden["largest_sample_bytes"]), f"{inputs['max_tokens']:,} tokens")
    sizes.add_row("verifier weights", _size(plan["verifier_weights_bytes"]), "B and C only")
    sizes.add_row("prompts + answers (text)", _size(plan["text_bytes"]), "~4 B per token")
    sizes.add_row(
        "draft checkpoints",
        _size(plan["checkpoints_bytes"]),
        f"{plan['draft_params'] / 1e9:.2f}B params x 12 B x {inputs['keep_checkpoints']}",
    )
    console.print(sizes)

    rates = plan["rates"]
    console.print(
        f"link {inputs['link_gbit']:.3g} Gbit/s x {inputs['link_efficiency']:g} = "
        f"{rates['link_bytes_per_s'] * 8 / 1e9:.2f} Gbit/s effective "
        f"({inputs['sources']['link']}); "
        f"extraction on the rented machine {rates['target_tokens_per_s']:,.0f} tokens/s "
        f"({inputs['sources']['target_tokens_per_s']}); "
        f"${rates['machine_usd_per_hour']:,.2f}/h"
    )
    table = Table(title="Scenarios (training itself, the same in A and B, not included)", title_justify="left")
    for column in ("", "scenario", "steps", "rented time", "wall time", "cost", f"disk (+{inputs['headroom']:.0%})"):
        table.add_column(column, justify="right" if column in ("rented time", "wall time", "cost") else "left")
    best = plan["recommendation"]["scenario"]
    for key, s in plan["scenarios"].items():
        steps = ", ".join(f"{name.replace('_', ' ')} {_hours(sec)}" for name, sec in s["steps_s"].items())
        disk = _size(s["disk_bytes"]) + ("" if s["fits_disk"] else " (does not fit)")
        table.add_row(
            ("* " if key == best else "") + key,
            s["name"],
            steps,
            _hours(s["rented_s"]),
            _hours(s["wall_s"]),
            f"${s['cost_usd']:,.0f}",
            disk,
        )
    console.print(table)
    console.print(
        f"[bold]recommendation: {best}[/bold] ({plan['scenarios'][best]['name']}): {plan['recommendation']['reason']}"
    )
    even = plan["break_even_a_vs_b"]
    if even["tokens"] is None:
        console.print(f"break-even A vs B: none; {even['meaning']}")
    else:
        console.print(
            f"break-even A vs B: {even['tokens']:,.0f} tokens = {even['samples']:,.0f} samples of this length "
            f"({_size(even['raw_bytes'])} raw, {_size(even['stored_bytes'])} stored); {even['meaning']}"
        )


def main(args: argparse.Namespace) -> None:
    plan = compute(inputs_from_args(args))
    if args.json:
        print(json.dumps(plan, indent=2))
    else:
        render(plan)
