"""Crash-safe outputs: deterministic JSON, and directories that appear whole or not at all.

Identical content gives identical bytes (no timestamps, sorted keys), so DVC
hashes stay stable and downstream stages are not invalidated by a rerun.
"""

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def dumps(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(dumps(data), encoding="utf-8")
    os.replace(partial, path)


@contextmanager
def staged_dir(out: Path) -> Iterator[Path]:
    """Yield an empty scratch directory beside `out`; on success it replaces `out`, on any error it is deleted.

    A run killed at any point leaves either the previous `out` or the new one, never a mix.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}-", dir=out.parent) as scratch:
        staging = Path(scratch) / out.name
        staging.mkdir()
        yield staging
        old = out.with_name(f".{out.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        if out.exists():
            os.replace(out, old)
        os.replace(staging, out)
        shutil.rmtree(old, ignore_errors=True)


def resume_or_reset(out: Path, key: str, settings: dict[str, Any]) -> bool:
    """Prepare a resumable output directory: keep its finished files if they were made with the same settings
    (`key`), else empty it. Unfinished writes (*.partial) are always removed. Returns True when work is kept."""
    run_file = out / "run.json"
    kept = run_file.is_file() and json.loads(run_file.read_text(encoding="utf-8")).get("key") == key
    if not kept:
        if out.exists():
            shutil.rmtree(out)
        write_json(run_file, {"key": key, "settings": settings})
    for partial in out.rglob("*.partial"):
        partial.unlink()
    return kept


RUN_RECORDS = Path(".eagle3/last_run")


def measured_run(root: Path, stage: str, this_run: dict[str, Any], did_work: bool) -> dict[str, Any]:
    """A stage's `this_run` throughput: this run's own if it did work (and remembered), else the last one remembered.

    The record lives in the git-ignored .eagle3/last_run/, outside DVC's outputs: `dvc repro` deletes a stage's
    metrics file before running it, and a timing inside a data output would change that output's hash.
    """
    record = root / RUN_RECORDS / f"{stage}.json"
    if did_work:
        write_json(record, this_run)
        return this_run
    try:
        remembered = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return this_run
    return remembered if isinstance(remembered, dict) else this_run
