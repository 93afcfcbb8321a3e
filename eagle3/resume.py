"""Resumable outputs: the run key that says which finished work may be kept, and what a rerun reports.

generate, extract and train write their outputs piece by piece (parts, shards, checkpoints), each atomically,
into a directory DVC keeps between runs (`persist: true`). The directory's run.json holds a key: the sha256 of
every setting that shapes the pieces (params without their execution-only fields, the verifier's identity,
the inputs' hashes, the format version). A rerun with the same key keeps the finished pieces; any other key
empties the directory first, so pieces made with different settings are never mixed.
"""

import fcntl
import hashlib
import json
from pathlib import Path
from typing import Any, NamedTuple

from eagle3.files import empty_dir, remove_unheld, write_json
from eagle3.paths import LAST_RUN_DIR

RUN_FILE = "run.json"


def run_key(settings: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


class Resumed(NamedTuple):
    key: str
    kept: bool  # whether the finished work in the directory was made with these settings and is kept


def resume_or_reset(out: Path, settings: dict[str, Any]) -> Resumed:
    """Prepare a resumable output directory: keep its finished files if they were made with the same settings,
    else empty it. Unfinished writes (*.partial) are removed unless a live writer holds them (a rank that started
    earlier, eagle3/files.py).

    Ranks that share the directory (`--rank R --world-size W`) start together: an exclusive lock beside it
    (`.<name>.lock`) lets one of them decide and write run.json while the others wait, then find it kept."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            key = run_key(settings)
            run_file = out / RUN_FILE
            kept = run_file.is_file() and json.loads(run_file.read_text(encoding="utf-8")).get("key") == key
            if not kept:
                # The directory itself stays: it may link to, or be a mount of, another volume (docs/hero-run.md).
                empty_dir(out)
                write_json(run_file, {"key": key, "settings": settings})
            for partial in out.rglob("*.partial"):
                remove_unheld(partial)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return Resumed(key, kept)


def measured_run(root: Path, stage: str, this_run: dict[str, Any], did_work: bool) -> dict[str, Any]:
    """A stage's `this_run` throughput: this run's own if it did work (and remembered), else the last one remembered.

    The record lives in the git-ignored .eagle3/last_run/, outside DVC's outputs: `dvc repro` deletes a stage's
    metrics file before running it, and a timing inside a data output would change that output's hash.
    """
    record = root / LAST_RUN_DIR / f"{stage}.json"
    if did_work:
        write_json(record, this_run)
        return this_run
    try:
        remembered = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return this_run
    return remembered if isinstance(remembered, dict) else this_run
