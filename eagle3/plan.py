"""`eagle3 plan`: disk, time and cost of the hero run before any money is spent.

Not a DVC stage: it reads CLI flags (and `metrics/extract.json` for the measured compression ratio) and prints a
table or JSON. Every number comes from one of the formulas below; README.md ("Planning the hero run") walks
through the seed case.

Units: 1 GB = 1e9 bytes, 1 TB = 1e12 bytes, 1 Gbit/s = 1e9 bit/s (as links and disks are sold).

Sizes
    tokens              = samples * mean_tokens
    bytes_per_token     = captured_layers * hidden_size * bytes_per_element
    raw                 = tokens * bytes_per_token
    stored              = raw / compression_ratio                   (ratio measured by the extract stage)
    largest_sample      = max_tokens * bytes_per_token              (one record, held in memory while written)
    text                = tokens * TEXT_BYTES_PER_TOKEN             (prompts + synthetic answers, before zstd)
    draft_params        = 10 * H^2 + 3 * H * intermediate + draft_vocab * H
                          (fc 3H^2; q, k, v from 2H to H: 6H^2; o_proj H^2; gated MLP; draft lm_head;
                           embeddings are the verifier's and are not stored)
    checkpoints         = draft_params * CHECKPOINT_BYTES_PER_PARAM * keep_checkpoints
    disk(scenario)      = (the items that scenario keeps on the rented machine) * (1 + headroom)

Rates
    link_bytes_per_s    = link_gbit * 1e9 * link_efficiency / 8
    flops_per_token     = 2 * active_params + 2 * num_layers * mean_tokens * hidden_size
                          (forward matmuls; causal attention averages mean_tokens / 2 keys per token, and
                           QK^T plus AV cost 2 * 2 * hidden FLOPs per key per layer)
    target_tokens_per_s = --extract-tokens-per-s, else gpus * gpu_tflops * 1e12 * mfu / flops_per_token
    machine_usd_per_h   = gpus * gpu_usd_per_hour

Scenarios (rented hours are what the bill counts; training itself is the same in A and B and is left out)
    A  extract here, ship the stored shards:   rented = stored / link
                                               cost   = rented * machine_usd_per_h
                                                        + (tokens / here_tokens_per_s) * here_usd_per_hour
    B  ship text, extract on the rented box:   rented = (weights + text) / link + tokens / target_tokens_per_s
    C  online, no hidden states on disk:       rented = (weights + text) / link + epochs * tokens / target_tokens_per_s

Break-even between A and B (both costs are linear in tokens N; B also pays once to fetch the verifier weights):
    cost_A(N) = N * a,  a = stored_per_token / link * P + here_usd_per_token
    cost_B(N) = F + N * b,  F = weights / link * P,  b = (text_per_token / link + 1 / target_tokens_per_s) * P
    N* = F / (a - b) when a > b: A is cheaper below N*, B above. When a <= b, A is cheaper at any size.
"""

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eagle3.errors import Eagle3Error

GB, TB = 1e9, 1e12
# Prompts and answers as UTF-8 text: ~4 characters per token, before zstd.
TEXT_BYTES_PER_TOKEN = 4
# fp32 weights + AdamW's two fp32 moments, the state a resumable checkpoint must hold.
CHECKPOINT_BYTES_PER_PARAM = 12


@dataclass(frozen=True)
class VerifierShape:
    name: str
    hidden_size: int
    num_layers: int
    vocab_size: int
    intermediate_size: int
    total_params: float | None
    active_params: float | None
    weights_bytes: float | None


PRESETS = {
    # Kimi-K2.5 (DeepSeek-V3 architecture): dense MLP width 18432; ~1.03T parameters, 32B active per token; the
    # published checkpoint (int4 routed experts) is ~600 GB.
    "kimi-k2.5": VerifierShape("moonshotai/Kimi-K2.5", 7168, 61, 163840, 18432, 1.03e12, 32e9, 600 * GB),
}


@dataclass
class Inputs:
    verifier: VerifierShape
    samples: int
    mean_tokens: float
    max_tokens: int
    captured_layers: int
    bytes_per_element: int
    compression_ratio: float
    link_gbit: float
    link_efficiency: float
    weights_link_gbit: float
    target_tokens_per_s: float | None
    gpus: int
    gpu_tflops: float
    mfu: float
    gpu_usd_per_hour: float
    here_tokens_per_s: float | None
    here_usd_per_hour: float
    epochs: int
    draft_vocab: int
    keep_checkpoints: int
    headroom: float
    disk_tb: float | None
    sources: dict[str, str] = field(default_factory=dict)


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
        text = config.get("text_config") or config
        hidden, layers, vocab = int(text["hidden_size"]), int(text["num_hidden_layers"]), int(text["vocab_size"])
        intermediate = int(text.get("intermediate_size") or 4 * hidden)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise Eagle3Error(f"{path}: not a usable verifier config.json ({type(exc).__name__}: {exc}); it needs hidden_size, num_hidden_layers and vocab_size") from None
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
            f"{path} not found: the compression ratio comes from the extract stage's metrics; run `dvc repro extract` (or `dvc pull`) or pass --compression-ratio"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise Eagle3Error(f"{path}: no usable compression_ratio ({type(exc).__name__}: {exc}); rerun the extract stage or pass --compression-ratio") from None
    return metrics


def _positive(name: str, value: float | None, allow_zero: bool = False) -> None:
    if value is None:
        return
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise Eagle3Error(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value:g}")


def inputs_from_args(args: argparse.Namespace) -> Inputs:
    for flag in ("samples", "mean_tokens", "max_tokens", "layers", "bytes_per_element", "link_gbit", "link_efficiency",
                 "weights_link_gbit", "extract_tokens_per_s", "gpus", "gpu_tflops", "mfu", "here_tokens_per_s",
                 "epochs", "draft_vocab", "keep_checkpoints", "disk_tb", "compression_ratio"):
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
        raise Eagle3Error("--here-usd-per-hour needs the extraction speed here: pass --here-tokens-per-s (or run the extract stage here once)")

    target_tps = args.extract_tokens_per_s
    sources["target_tokens_per_s"] = "--extract-tokens-per-s"
    if target_tps is None:
        if verifier.active_params is None and args.active_params is None:
            raise Eagle3Error(f"verifier {args.verifier!r} has no parameter count: pass --extract-tokens-per-s, or --active-params to derive it from GPU FLOP/s")
        sources["target_tokens_per_s"] = f"derived: {args.gpus} GPUs x {args.gpu_tflops:g} TFLOP/s x MFU {args.mfu:g}"
    if args.active_params is not None:
        _positive("--active-params", args.active_params)
        verifier = VerifierShape(**{**asdict(verifier), "active_params": args.active_params})
    if args.weights_gb is not None:
        _positive("--weights-gb", args.weights_gb)
        verifier = VerifierShape(**{**asdict(verifier), "weights_bytes": args.weights_gb * GB})
    if verifier.weights_bytes is None:
        raise Eagle3Error(f"verifier {args.verifier!r}: weights size unknown (no safetensors beside its config.json): pass --weights-gb")

    _positive("--probe-mb", args.probe_mb)
    link_gbit, link_efficiency = args.link_gbit, args.link_efficiency
    sources["link"] = "--link-gbit x --link-efficiency"
    if args.link_from_remote:
        from eagle3.remotes import measure_upload

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


def compute(inputs: Inputs) -> dict[str, Any]:
    """The whole plan as plain numbers (bytes, seconds, dollars). Formulas: the module docstring."""
    v = inputs.verifier
    tokens = inputs.samples * inputs.mean_tokens
    bytes_per_token = inputs.captured_layers * v.hidden_size * inputs.bytes_per_element
    raw = tokens * bytes_per_token
    stored = raw / inputs.compression_ratio
    text = tokens * TEXT_BYTES_PER_TOKEN
    draft_params = 10 * v.hidden_size**2 + 3 * v.hidden_size * v.intermediate_size + inputs.draft_vocab * v.hidden_size
    checkpoints = draft_params * CHECKPOINT_BYTES_PER_PARAM * inputs.keep_checkpoints
    weights = v.weights_bytes

    link = inputs.link_gbit * 1e9 * inputs.link_efficiency / 8
    weights_link = inputs.weights_link_gbit * 1e9 * inputs.link_efficiency / 8
    flops_per_token = 2 * (v.active_params or 0) + 2 * v.num_layers * inputs.mean_tokens * v.hidden_size
    target_tps = inputs.target_tokens_per_s or inputs.gpus * inputs.gpu_tflops * 1e12 * inputs.mfu / flops_per_token
    machine_usd_per_s = inputs.gpus * inputs.gpu_usd_per_hour / 3600
    here_seconds = tokens / inputs.here_tokens_per_s if inputs.here_tokens_per_s else None
    here_usd = here_seconds * inputs.here_usd_per_hour / 3600 if here_seconds is not None else 0.0

    fetch = weights / weights_link + text / link
    extract = tokens / target_tps
    scenarios = {
        "A": {
            "name": "extract here, ship hidden states",
            "steps_s": {"extract_here": here_seconds, "transfer_hidden_states": stored / link},
            "rented_s": stored / link,
            "disk_bytes": (stored + checkpoints) * (1 + inputs.headroom),
        },
        "B": {
            "name": "ship text, extract on the rented machine",
            "steps_s": {"fetch_weights_and_text": fetch, "extract": extract},
            "rented_s": fetch + extract,
            "disk_bytes": (weights + text + stored + checkpoints) * (1 + inputs.headroom),
        },
        "C": {
            "name": "online training, no hidden states on disk",
            "steps_s": {"fetch_weights_and_text": fetch, "verifier_forward_all_epochs": inputs.epochs * extract},
            "rented_s": fetch + inputs.epochs * extract,
            "disk_bytes": (weights + text + checkpoints) * (1 + inputs.headroom),
        },
    }
    for key, scenario in scenarios.items():
        scenario["cost_usd"] = scenario["rented_s"] * machine_usd_per_s + (here_usd if key == "A" else 0.0)
        known = [s for s in scenario["steps_s"].values() if s is not None]
        scenario["wall_s"] = sum(known) if len(known) == len(scenario["steps_s"]) else None
        scenario["fits_disk"] = inputs.disk_tb is None or scenario["disk_bytes"] <= inputs.disk_tb * TB

    per_token_a = bytes_per_token / inputs.compression_ratio / link * machine_usd_per_s
    if here_seconds is not None:
        per_token_a += inputs.here_usd_per_hour / 3600 / inputs.here_tokens_per_s
    per_token_b = (TEXT_BYTES_PER_TOKEN / link + 1 / target_tps) * machine_usd_per_s
    fixed_b = weights / weights_link * machine_usd_per_s
    if per_token_a > per_token_b:
        n = fixed_b / (per_token_a - per_token_b)
        break_even = {"tokens": n, "samples": n / inputs.mean_tokens, "raw_bytes": n * bytes_per_token,
                      "stored_bytes": n * bytes_per_token / inputs.compression_ratio,
                      "meaning": "A is cheaper below this size, B above"}
    else:
        break_even = {"tokens": None, "samples": None, "raw_bytes": None, "stored_bytes": None,
                      "meaning": "A is cheaper at any size: shipping a token's states costs less than extracting it there"}

    feasible = [k for k, s in scenarios.items() if s["fits_disk"]] or list(scenarios)
    best = min(feasible, key=lambda k: (round(scenarios[k]["cost_usd"], 2), scenarios[k]["wall_s"] or math.inf))
    reason = f"lowest rented-machine cost (${scenarios[best]['cost_usd']:,.0f})"
    if len(feasible) < len(scenarios):
        reason += f"; {', '.join(sorted(set(scenarios) - set(feasible)))} do not fit {inputs.disk_tb:g} TB of disk"
    if best == "C" and len(feasible) == len(scenarios):
        reason += "; it also needs no disk for hidden states"

    return {
        "inputs": {**{k: v for k, v in asdict(inputs).items() if k != "sources"}, "sources": inputs.sources},
        "tokens": tokens,
        "bytes_per_token": bytes_per_token,
        "hidden_states": {"raw_bytes": raw, "stored_bytes": stored, "largest_sample_bytes": inputs.max_tokens * bytes_per_token},
        "text_bytes": text,
        "verifier_weights_bytes": weights,
        "draft_params": draft_params,
        "checkpoints_bytes": checkpoints,
        "rates": {"link_bytes_per_s": link, "flops_per_token": flops_per_token, "target_tokens_per_s": target_tps,
                  "machine_usd_per_hour": machine_usd_per_s * 3600},
        "scenarios": scenarios,
        "recommendation": {"scenario": best, "reason": reason},
        "break_even_a_vs_b": break_even,
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    data = parser.add_argument_group("data")
    data.add_argument("--verifier", default="kimi-k2.5", help=f"preset ({', '.join(PRESETS)}) or a config.json / model dir (default kimi-k2.5)")
    data.add_argument("--samples", type=int, required=True, help="training samples (conversations)")
    data.add_argument("--mean-tokens", type=float, required=True, help="mean tokens per sample")
    data.add_argument("--max-tokens", type=int, help="longest sample in tokens (default: the mean)")
    data.add_argument("--layers", type=int, default=4, help="captured layers: aux layers + the final one (default 4)")
    data.add_argument("--bytes-per-element", type=int, default=2, help="2 for bf16 (default)")
    data.add_argument("--compression-ratio", type=float, help="raw/stored bytes (default: compression_ratio in --metrics)")
    data.add_argument("--metrics", default="metrics/extract.json", help="the extract stage's metrics (default metrics/extract.json)")
    machines = parser.add_argument_group("link and machines")
    machines.add_argument("--link-gbit", type=float, default=5.0, help="link between here and the rented machine, Gbit/s (default 5)")
    machines.add_argument("--link-efficiency", type=float, default=0.8, help="share of the line rate a transfer reaches (default 0.8; benchmarks/transfer.py measures it)")
    machines.add_argument("--link-from-remote", metavar="REMOTE", help="measure the link instead: time an upload to this DVC remote with DVC's own transport")
    machines.add_argument("--probe-mb", type=float, default=256.0, help="size of that upload, MB (default 256)")
    machines.add_argument("--weights-link-gbit", type=float, help="Gbit/s at which the rented machine gets the verifier weights (default: --link-gbit)")
    machines.add_argument("--extract-tokens-per-s", type=float, help="extraction speed on the rented machine (default: derived from FLOP/s)")
    machines.add_argument("--active-params", type=float, help="verifier parameters active per token (presets know it)")
    machines.add_argument("--weights-gb", type=float, help="verifier weights on disk, GB (presets and safetensors indexes know it)")
    machines.add_argument("--gpus", type=int, default=8, help="GPUs on the rented machine (default 8)")
    machines.add_argument("--gpu-tflops", type=float, default=989.0, help="dense bf16 TFLOP/s per GPU (default 989, H100 SXM)")
    machines.add_argument("--mfu", type=float, default=0.3, help="model FLOP utilisation of extraction (prefill only; default 0.3)")
    machines.add_argument("--gpu-usd-per-hour", type=float, default=2.5, help="rented price per GPU-hour (default 2.5)")
    machines.add_argument("--here-tokens-per-s", type=float, help="extraction speed here (default: this_run.tokens_per_s in --metrics)")
    machines.add_argument("--here-usd-per-hour", type=float, default=0.0, help="cost of an hour of extraction here (default 0: owned)")
    training = parser.add_argument_group("training")
    training.add_argument("--epochs", type=int, default=4, help="epochs; online training reruns the verifier in each (default 4)")
    training.add_argument("--draft-vocab", type=int, default=32000, help="draft vocabulary (default 32000)")
    training.add_argument("--keep-checkpoints", type=int, default=3, help="resumable checkpoints kept on disk (default 3)")
    training.add_argument("--headroom", type=float, default=0.2, help="free-space margin on top of everything, fraction (default 0.2)")
    training.add_argument("--disk-tb", type=float, help="rented machine's disk, TB: scenarios that do not fit are ruled out")
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
    sizes.add_row("bytes per token", f"{plan['bytes_per_token']:,} B",
                  f"{inputs['captured_layers']} layers x {v['hidden_size']} x {inputs['bytes_per_element']} B")
    sizes.add_row("hidden states, raw", _size(hidden["raw_bytes"]), "tokens x bytes per token")
    sizes.add_row("hidden states, stored", _size(hidden["stored_bytes"]),
                  f"raw / {inputs['compression_ratio']:g} ({inputs['sources']['compression_ratio']})")
    sizes.add_row("largest sample", _size(hidden["largest_sample_bytes"]), f"{inputs['max_tokens']:,} tokens")
    sizes.add_row("verifier weights", _size(plan["verifier_weights_bytes"]), "B and C only")
    sizes.add_row("prompts + answers (text)", _size(plan["text_bytes"]), "~4 B per token")
    sizes.add_row("draft checkpoints", _size(plan["checkpoints_bytes"]),
                  f"{plan['draft_params'] / 1e9:.2f}B params x 12 B x {inputs['keep_checkpoints']}")
    console.print(sizes)

    rates = plan["rates"]
    console.print(
        f"link {inputs['link_gbit']:.3g} Gbit/s x {inputs['link_efficiency']:g} = {rates['link_bytes_per_s'] * 8 / 1e9:.2f} Gbit/s effective "
        f"({inputs['sources']['link']}); "
        f"extraction on the rented machine {rates['target_tokens_per_s']:,.0f} tokens/s ({inputs['sources']['target_tokens_per_s']}); "
        f"${rates['machine_usd_per_hour']:,.2f}/h"
    )
    table = Table(title="Scenarios (training itself, the same in A and B, not included)", title_justify="left")
    for column in ("", "scenario", "steps", "rented time", "wall time", "cost", f"disk (+{inputs['headroom']:.0%})"):
        table.add_column(column, justify="right" if column in ("rented time", "wall time", "cost") else "left")
    best = plan["recommendation"]["scenario"]
    for key, s in plan["scenarios"].items():
        steps = ", ".join(f"{name.replace('_', ' ')} {_hours(sec)}" for name, sec in s["steps_s"].items())
        disk = _size(s["disk_bytes"]) + ("" if s["fits_disk"] else " (does not fit)")
        table.add_row(("* " if key == best else "") + key, s["name"], steps, _hours(s["rented_s"]), _hours(s["wall_s"]),
                      f"${s['cost_usd']:,.0f}", disk)
    console.print(table)
    console.print(f"[bold]recommendation: {best}[/bold] ({plan['scenarios'][best]['name']}): {plan['recommendation']['reason']}")
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
