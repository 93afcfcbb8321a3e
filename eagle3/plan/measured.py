"""The extract stage's measured figures as `eagle3 plan` reads them: its metrics (the compression ratio, and the
extraction rate where they were measured on this verifier), and the ratio rescaled to every extract.storage."""

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3.errors import Eagle3Error
from eagle3.files import read_report_json
from eagle3.formats.storage import DEFAULT_STORAGE, STORAGES
from eagle3.paths import EXTRACT_METRICS
from eagle3.plan.facts import VerifierShape
from eagle3.plan.flags import positive
from eagle3.plan.preflight_reports import PreflightFigures
from eagle3.plan.work import measured_verifier

# How a ratio measured with one extract.storage becomes another's (eagle3/formats/storage.py).
STORAGE_GAIN: dict[str, float] = {name: storage.gain_over_lossless for name, storage in STORAGES.items()}


def read_extract_metrics(path: Path) -> dict[str, Any]:
    fix = "rerun the extract stage or pass --compression-ratio"
    try:
        metrics = read_report_json(path, "the extract stage's metrics", fix, limit=16_000_000)
        float(metrics["compression_ratio"])
    except FileNotFoundError:
        raise Eagle3Error(
            f"{path} not found: the compression ratio comes from the extract stage's metrics; run `dvc repro extract` "
            "(or `dvc pull`) or pass --compression-ratio"
        ) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise Eagle3Error(f"{path}: no usable compression_ratio ({type(exc).__name__}: {exc}); {fix}") from None
    return metrics


@dataclass(frozen=True)
class Measured:
    """The extract stage's metrics where the plan needs them, and the verifier the project measured them on."""

    metrics: dict[str, Any] | None
    verifier: str | None
    same_verifier: bool

    @property
    def on(self) -> str:
        return self.verifier or "an unrecorded verifier"


def read_measurements(
    args: argparse.Namespace, root: Path, verifier: VerifierShape, ratio_elsewhere: bool = False
) -> Measured:
    """The metrics are needed for the ratio unless --compression-ratio (or a preflight: `ratio_elsewhere`) gives it,
    and read for the rate here as long as they were measured on this verifier."""
    metrics_path = args.metrics if args.metrics is not None else root / EXTRACT_METRICS
    measured_on = measured_verifier(root)
    same_verifier = measured_on == verifier.name
    given = args.compression_ratio is not None or ratio_elsewhere
    wanted = not given or (same_verifier and metrics_path.is_file())
    return Measured(read_extract_metrics(metrics_path) if wanted else None, measured_on, same_verifier)


def storage_ratios(ratio: float, storage: str) -> dict[str, float]:
    """`ratio`, that of `storage`, rescaled to every storage by their gains over lossless."""
    return {name: ratio * gain / STORAGE_GAIN[storage] for name, gain in STORAGE_GAIN.items()}


@dataclass(frozen=True)
class CompressionRatio:
    ratio: float
    storage: str
    source: str
    # extract.storage's every choice at this ratio's scale
    storage_ratios: dict[str, float]
    # read from metrics measured on another verifier's states, which the plan warns of
    measured_elsewhere: bool


def compression_ratio(
    args: argparse.Namespace, measured: Measured, preflight: PreflightFigures | None = None
) -> CompressionRatio:
    """--compression-ratio, else a preflight's (measured with --storage's storage), else the extract metrics' one
    rescaled from the storage it was measured with to --storage's."""
    if args.compression_ratio is None and preflight is not None and preflight.compression_ratio is not None:
        ratio, storage = preflight.compression_ratio, preflight.storage
        source = preflight.sources["compression_ratio"]
        if storage is None:  # a preflight report records its storage beside its ratio
            raise Eagle3Error(f"{source}: a compression ratio without the extract.storage it was measured with")
        return CompressionRatio(ratio, storage, source, storage_ratios(ratio, storage), False)
    metrics = measured.metrics
    # A metrics file older than extract.storage was written by the lossless codec.
    measured_storage: str | None = metrics.get("storage", DEFAULT_STORAGE) if metrics else None
    storage = args.storage or measured_storage or DEFAULT_STORAGE
    if args.compression_ratio is not None:
        ratio = args.compression_ratio
        return CompressionRatio(
            ratio, storage, f"--compression-ratio (storage {storage})", storage_ratios(ratio, storage), False
        )
    if metrics is None or measured_storage is None:  # read_measurements reads them where no ratio is given
        raise Eagle3Error(
            f"{args.metrics or EXTRACT_METRICS}: no compression ratio and storage read; pass --compression-ratio"
        )
    ratio = float(metrics["compression_ratio"])
    positive(f"{args.metrics or EXTRACT_METRICS}: compression_ratio", ratio)
    source = f"{args.metrics or EXTRACT_METRICS}, measured with storage {measured_storage} on {measured.on}"
    if storage != measured_storage:
        factor = STORAGE_GAIN[storage] / STORAGE_GAIN[measured_storage]
        ratio *= factor
        source += f", x{factor:.3f} for {storage} (benchmarks/storage_8bit.py)"
    return CompressionRatio(ratio, storage, source, storage_ratios(ratio, storage), not measured.same_verifier)
