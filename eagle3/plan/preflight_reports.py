"""`eagle3 plan --preflight FILE` / `--here-preflight FILE`: what `eagle3 preflight` measured on a machine
(eagle3/preflight/run.py's JSON) in place of the plan's derived figures.

From the rented machine's file (`there`): the training rate per GPU, the extraction rate, the compression ratio and
the free disk; from this machine's (`here`): the extraction rate and the free disk. A flag given explicitly still
wins. A figure measured for something else than the plan describes is refused, with one warning line saying why:
another verifier (every rate and the ratio), another draft shape or TTT depth (the training rate), another
extract.storage (the ratio). A file that is not a preflight report is one error line.
"""

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from eagle3.errors import Eagle3Error
from eagle3.files import read_report_json
from eagle3.formats.storage import StorageName
from eagle3.gpu_kinds import GPUS
from eagle3.hashing import sha256_file
from eagle3.params.train import Optimizer
from eagle3.plan.facts import Machine, VerifierShape

TB = 1e12
# A preflight report is a few KB: anything past this is not one.
_REPORT_BYTES = 4_000_000


@dataclass
class PreflightFigures:
    """The figures one file gives the plan (None: not measured there, or refused), each with its source words."""

    train_tokens_per_s_per_gpu: float | None = None
    # One optimizer step of the plan's train.optimizer, measured beside the training rate, which leaves it out.
    optimizer_step_s: float | None = None
    extract_tokens_per_s: float | None = None
    compression_ratio: float | None = None
    disk_tb: float | None = None
    # extract.storage the compression ratio was measured with
    storage: str | None = None
    sources: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


# What a figure may be, whatever a report says: finite, positive, below any machine's (1e15 tokens/s, 1 EB).
Rate = Annotated[float, Field(gt=0, lt=1e15, allow_inf_nan=False)]
Bytes = Annotated[float, Field(ge=0, lt=1e18, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0, lt=1_000_000_000)]
Text = Annotated[str, Field(max_length=1000)]


class _Part(BaseModel):
    # A report carries more than the plan reads: the rest is left alone, what is read is checked.
    model_config = ConfigDict(extra="ignore", strict=False)


class _MachineFigures(_Part):
    accelerator_count: Count | None = None


class _DataPathFigures(_Part):
    free_bytes: Bytes | None = None


class _ExtractionFigures(_Part):
    tokens_per_s: Rate | None = None
    compression_ratio: Annotated[float, Field(gt=1, lt=100, allow_inf_nan=False)] | None = None
    storage: StorageName | None = None
    backend: Text | None = None
    tensor_parallel_size: Annotated[int, Field(ge=1, le=1024)] | None = None


class _TrainingFigures(_Part):
    tokens_per_s: Rate | None = None
    device: Text | None = None
    measured_tokens: Annotated[int, Field(ge=1, lt=100_000_000)] | None = None
    precision: Text | None = None
    optimizer: Optimizer | None = None
    optimizer_step_seconds: Annotated[float, Field(ge=0, lt=1e6, allow_inf_nan=False)] | None = None


_FIGURES = {
    "machine": _MachineFigures,
    "data_path": _DataPathFigures,
    "extraction": _ExtractionFigures,
    "training": _TrainingFigures,
}


class _Item(_Part):
    status: Text
    figures: dict[str, Any] = {}


class _Verifier(_Part):
    name: Text | None = None
    config_sha256: Text | None = None


class _Draft(_Part):
    hidden_size: Count | None = None
    vocab_size: Count | None = None
    draft_vocab_size: Count | None = None


class _Identity(_Part):
    verifier: _Verifier | None = None
    draft: _Draft | None = None
    ttt_steps: Count | None = None


class _Report(_Part):
    format_version: int
    machine: Text | None = None
    made: Text | None = None
    identity: _Identity = _Identity()
    items: dict[str, _Item]


def _validated(model: type[BaseModel], raw: object, prefix: str, flag: str, path: Path, fix: str) -> Any:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        problem = exc.errors()[0]
        where = prefix + ".".join(str(part) for part in problem["loc"])
        shown = repr(problem.get("input"))[:80]
        raise Eagle3Error(f"{flag} {path}: {where or '(top level)'}: {problem['msg']}, got {shown}; {fix}") from None


def read_report(path: Path, flag: str) -> dict[str, Any]:
    """The report at `path`, every part the plan reads checked (types, ranges, finiteness, size): a bad one is one
    error naming the file and the field, never a figure."""
    from eagle3.preflight.run import FORMAT_VERSION

    fix = "rerun `eagle3 preflight` on that machine and copy its file"
    try:
        raw = read_report_json(path, "an eagle3 preflight report", fix, limit=_REPORT_BYTES)
    except FileNotFoundError:
        raise Eagle3Error(f"{flag} {path}: not found; run `eagle3 preflight` on that machine, copy its file") from None
    except Eagle3Error as exc:
        raise Eagle3Error(f"{flag} {exc}") from None
    report = _validated(_Report, raw, "", flag, path, fix)
    if report.format_version != FORMAT_VERSION:
        raise Eagle3Error(
            f"{flag} {path}: format_version {report.format_version}, this eagle3 reads {FORMAT_VERSION}; {fix}"
        )
    items = {}
    for name, item in report.items.items():
        model = _FIGURES.get(name)
        figures = _validated(model, item.figures, f"items.{name}.figures.", flag, path, fix) if model else None
        items[name] = {"status": item.status, "figures": figures.model_dump(exclude_unset=True) if figures else {}}
    return {**report.model_dump(exclude={"items"}), "items": items}


def _ready(report: dict[str, Any], item: str) -> dict[str, Any] | None:
    entry = report["items"].get(item) or {}
    return entry.get("figures") if entry.get("status") == "ready" else None


def _draft_mismatch(identity: dict[str, Any], verifier: VerifierShape, draft_vocab: int, ttt_steps: int) -> str | None:
    draft = identity.get("draft") or {}
    wanted = {
        "hidden_size": verifier.hidden_size,
        "vocab_size": verifier.vocab_size,
        "draft_vocab_size": draft_vocab,
    }
    for key, value in wanted.items():
        if draft.get(key) != value:
            return f"its draft has {key} {draft.get(key)}, the plan's {value}"
    if identity.get("ttt_steps") != ttt_steps:
        return f"it trained {identity.get('ttt_steps')} TTT steps, the plan {ttt_steps} (--ttt-steps)"
    return None


def same_verifier(identity: dict[str, Any], verifier: VerifierShape, verifier_spec: str) -> bool:
    """The report's verifier is the plan's: the same name, or the same config.json bytes where --verifier names a
    file or directory (a local directory's config rarely carries the Hub name the verifier stage records)."""
    recorded = identity.get("verifier") or {}
    if recorded.get("name") == verifier.name:
        return True
    config = Path(verifier_spec)
    config = config / "config.json" if config.is_dir() else config
    return config.is_file() and recorded.get("config_sha256") == sha256_file(config)


def figures_from(
    report: dict[str, Any],
    path: Path,
    flag: str,
    side: str,
    verifier: VerifierShape,
    verifier_spec: str,
    storage: str | None,
    draft_vocab: int,
    ttt_steps: int,
    optimizer: str,
) -> PreflightFigures:
    """What `report` (read from `path`) gives the plan's machine `side` ("there" or "here"); `storage`: --storage
    (None: the report's own is taken)."""
    identity = report.get("identity") or {}
    where = f"measured by preflight on {report.get('machine') or 'an unnamed machine'}, {report.get('made', '?')}"
    figures = PreflightFigures()
    data_path = _ready(report, "data_path") or {}
    free = data_path.get("free_bytes")
    if isinstance(free, (int, float)) and free > 0:
        figures.disk_tb = free / TB
        figures.sources["disk"] = f"free space at data/hidden, {where}"
    measured_on = (identity.get("verifier") or {}).get("name")
    if measured_on is None:
        raise Eagle3Error(
            f"{flag} {path}: made before the verifier stage ran on {report.get('machine') or 'that machine'}, so it "
            "measured no verifier: run `dvc repro verifier` there (or `dvc pull` its record, with the weights in "
            "place), then `eagle3 preflight` again"
        )
    if not same_verifier(identity, verifier, verifier_spec):
        figures.warnings.append(
            f"{flag} {path}: rates and compression ratio not used: measured with verifier {measured_on!r}, the plan "
            f"is for {verifier.name!r}"
        )
        return figures
    extraction = _ready(report, "extraction") or {}
    if extraction.get("tokens_per_s"):
        figures.extract_tokens_per_s = float(extraction["tokens_per_s"])
        tp = extraction.get("tensor_parallel_size")
        figures.sources["extract"] = f"{where}: extract.backend {extraction.get('backend')}" + (
            f", tensor parallel {tp}" if tp else ""
        )
    if extraction.get("compression_ratio"):
        if storage is not None and extraction.get("storage") != storage:
            figures.warnings.append(
                f"{flag} {path}: compression ratio not used: measured with storage {extraction.get('storage')}, "
                f"the plan assumes {storage} (--storage)"
            )
        else:
            figures.compression_ratio = float(extraction["compression_ratio"])
            figures.storage = extraction.get("storage")
            figures.sources["compression_ratio"] = f"{where}, storage {figures.storage}, real states of {verifier.name}"
    training = _ready(report, "training") or {}
    if side == "there" and training.get("tokens_per_s"):
        mismatch = _draft_mismatch(identity, verifier, draft_vocab, ttt_steps)
        if mismatch:
            figures.warnings.append(f"{flag} {path}: training rate not used: {mismatch}")
        else:
            figures.train_tokens_per_s_per_gpu = float(training["tokens_per_s"])
            figures.sources["train"] = (
                f"{where}: one {training.get('device')} at {training.get('measured_tokens'):,}-token samples, "
                f"{training.get('precision')}"
            )
            if training.get("optimizer") == optimizer and training.get("optimizer_step_seconds") is not None:
                figures.optimizer_step_s = float(training["optimizer_step_seconds"])
                figures.sources["optimizer_step"] = f"{where}: one {optimizer} step on one {training.get('device')}"
    return figures


def accelerator_warning(
    report: dict[str, Any], flag: str, path: Path, gpus_expected: int, preset_name: str
) -> str | None:
    """A warning where the report's machine has no GPUs while the plan's machine is `gpus_expected` x preset."""
    count = ((report["items"].get("machine") or {}).get("figures") or {}).get("accelerator_count")
    if count == 0 and gpus_expected > 0:
        return (
            f"{flag} {path} was measured on {report.get('machine')} (no GPUs), while the plan's machine is "
            f"{gpus_expected} x {preset_name}: its figures describe that machine, not this one"
        )
    return None


def preflights(args: argparse.Namespace, verifier: VerifierShape) -> tuple[PreflightFigures, PreflightFigures]:
    """What --preflight (the rented machine) and --here-preflight (this one) give, with their warnings."""
    found = []
    for flag, path, side, gpus, gpu in (
        ("--preflight", args.preflight, "there", args.gpus, args.gpu),
        ("--here-preflight", args.here_preflight, "here", args.here_gpus, args.here_gpu),
    ):
        if path is None:
            found.append(PreflightFigures())
            continue
        report = read_report(path, flag)
        figures = figures_from(
            report,
            path,
            flag,
            side,
            verifier,
            args.verifier,
            args.storage,
            args.draft_vocab,
            args.ttt_steps,
            args.optimizer,
        )
        warning = accelerator_warning(report, flag, path, gpus, GPUS[gpu].name)
        if warning:
            figures.warnings.append(warning)
        found.append(figures)
    return found[0], found[1]


def disk_words(
    machine: Machine, flag: str, given: float | None, preflight: PreflightFigures, default: str = "default"
) -> str:
    """How a machine's disk reads in the plan's sources: its size and where it came from (flag, preflight, default)."""
    if machine.disk_tb is None:
        return ""
    source = flag if given is not None else preflight.sources.get("disk", default)
    return f", disk {machine.disk_tb:,.3g} TB ({source})"
