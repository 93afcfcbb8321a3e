"""`eagle3 preflight`: measure the machine it runs on before a costly run spends money there.

A tool, not a DVC stage: it reads params.yaml and the verifier stage's output, writes one JSON file
(`--out`, default reports/preflight.json, which no stage writes) and one screen of text, and touches no pipeline
output (its scratch files live in a temporary directory). Each item measures one thing within its own time budget
(`BUDGETS_S` in eagle3/preflight/items.py; on an 8-GPU machine docs/preflight.md states what each costs there)
and ends in a verdict: `ready`, `fix` (what to change, in one line), `failed` (the measurement itself broke: its
one-line error) or `not available` (does not apply here, e.g. vLLM not installed). A failure in one item is
reported and the others still run.

The measurements are eagle3/preflight/machine.py's (the machine, precision, collectives, disk and shard
decoding) and eagle3/preflight/models.py's (the verifier, training, extraction and serving). `eagle3 plan
--preflight FILE` reads the JSON (eagle3/plan/preflight_reports.py).
"""

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from eagle3.errors import Eagle3Error
from eagle3.files import write_json
from eagle3.paths import REPORTS_DIR
from eagle3.preflight import machine, models
from eagle3.preflight.items import GB, ITEMS, Context, Fix, Item, NotAvailable

FORMAT_VERSION = 1
# No stage writes or reads it (a tool's output; eagle3/paths.py holds the stages' paths, which are their deps).
PREFLIGHT_REPORT = REPORTS_DIR / "preflight.json"


def _measurements() -> dict[str, Callable[[Context, Item], None]]:
    return {
        "machine": machine.measure_machine,
        "verifier": models.check_verifier,
        "training": models.measure_training,
        "collectives": machine.measure_collectives,
        "extraction": models.measure_extraction,
        "data_path": machine.measure_data_path,
        "serving": models.check_serving,
    }


def run_items(context: Context, names: tuple[str, ...]) -> dict[str, Item]:
    """Each item in order; an exception ends only that item, as its verdict."""
    measurements = _measurements()
    for name in names:
        item = Item(name)
        started = time.perf_counter()
        print(f"preflight: {name} ...", file=sys.stderr, flush=True)
        try:
            measurements[name](context, item)
        except Fix as problem:
            item.status, item.verdict = "fix", str(problem)
        except NotAvailable as reason:
            item.status, item.verdict = "not available", str(reason)
        except Eagle3Error as exc:
            item.status, item.verdict = "fix", str(exc)
        except Exception as exc:  # noqa: BLE001 - one broken measurement must not stop the others
            item.status, item.verdict = "failed", f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
        item.seconds = time.perf_counter() - started
        context.results[name] = item
    return context.results


def identity(context: Context) -> dict[str, Any]:
    """What the figures depend on, which `eagle3 plan --preflight` compares with the plan's (None where unknown)."""
    params = context.params
    provenance = context.provenance
    return {
        "verifier": None
        if provenance is None
        else {"name": provenance.name, "config_sha256": provenance.config_sha256, **provenance.weights_identity()},
        "draft": context.figure("training", "draft"),
        "storage": params.extract.storage,
        "ttt_steps": params.train.ttt_steps,
        "sample_tokens": params.extract.max_seq_len,
    }


def report(context: Context, names: tuple[str, ...], seconds: float) -> dict[str, Any]:
    return {
        "format_version": FORMAT_VERSION,
        "made": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": context.figure("machine", "description"),
        "identity": identity(context),
        "seconds": round(seconds, 1),
        "items": {name: context.results[name].to_json() for name in names},
    }


# The figures the screen shows per item (the JSON holds every figure with how it was measured).
HEADLINES = {
    "machine": ("description", "precision"),
    "verifier": ("name", "weight_bytes", "chat_template_tokens"),
    "training": ("device", "precision", "measured_tokens", "tokens_per_s", "peak_bytes", "estimated_peak_bytes"),
    "collectives": ("backend", "processes", "bytes", "bus_gbytes_per_s", "added_seconds_per_step"),
    "extraction": ("backend", "dtype", "tokens", "tokens_per_s", "storage", "compression_ratio"),
    "data_path": ("free_bytes", "needed_states_bytes", "loader_tokens_per_s", "loaders_keep_up"),
    "serving": ("vllm_version", "build", "draft", "mla", "start_and_generate_seconds", "num_drafts"),
}


def _figure_words(value: object, key: str = "") -> str:
    if key.endswith("bytes") and isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value / GB:,.2f} GB"
    if isinstance(value, float):
        return f"{value:,.4g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{inner_key}: {_figure_words(inner, key)}" for inner_key, inner in value.items()) + "}"
    return str(value)


def screen(result: dict[str, Any]) -> str:
    """One screen: per item its headline figures and the verdict."""
    lines = [f"eagle3 preflight on {result['machine'] or 'this machine'} ({result['seconds']:g} s)"]
    for name, item in result["items"].items():
        figures = item["figures"]
        headline = ", ".join(f"{key} {_figure_words(figures[key], key)}" for key in HEADLINES[name] if key in figures)
        lines.append(f"  {name:<12} {headline}")
        mark = "ready" if item["status"] == "ready" else f"{item['status'].upper()}: {item['verdict']}"
        lines.append(f"  {'':<12} -> {mark}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, help=f"JSON file (default: the project's {PREFLIGHT_REPORT})")
    parser.add_argument("--only", nargs="+", choices=ITEMS, metavar="ITEM", help=f"only these: {', '.join(ITEMS)}")
    parser.add_argument(
        "--budget-scale",
        type=float,
        default=1.0,
        help="multiplies every item's measuring budget (default 1; the budgets: eagle3/preflight/run.py)",
    )


def _check_writable(out: Path, given: Path) -> None:
    try:
        if out.is_dir():
            raise IsADirectoryError(21, "a directory")
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out.parent, prefix=f".{out.name}."):
            pass
    except OSError as exc:
        raise Eagle3Error(f"--out {given}: cannot write there ({exc.strerror}); name a writable file") from None


def main(args: argparse.Namespace, root: Path) -> int:
    """0 when every item is ready or does not apply here, 1 when one needs a fix or failed."""
    from eagle3.params.params_file import load_params

    if not args.budget_scale > 0:
        raise Eagle3Error(f"--budget-scale must be > 0, got {args.budget_scale:g}")
    params = load_params(args.params)
    names = tuple(name for name in ITEMS if not args.only or name in args.only)
    out = args.out if args.out is not None else root / PREFLIGHT_REPORT
    _check_writable(out, out)  # before minutes of measuring, not after
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="eagle3-preflight-") as scratch:
        context = Context(root.resolve(), params, Path(scratch), args.budget_scale)
        run_items(context, names)
    result = report(context, names, time.perf_counter() - started)
    print(screen(result))  # the verdicts, even if the file cannot be written after all
    try:
        write_json(out, result)
    except OSError as exc:
        raise Eagle3Error(f"--out {out}: cannot write ({exc.strerror}); name a writable file") from None
    print(f"wrote {out}")
    return 0 if all(item["status"] in ("ready", "not available") for item in result["items"].values()) else 1
