"""Stage `prepare`: open prompt datasets -> validated, deduplicated, capped, split parquet + dataset card.

Outputs: data/prepared/ (format: eagle3/formats/prepared.py). Every rejected
row is counted by reason; nothing valid is dropped except by the duplicate rule
and the caps, which are counted too.

Order, caps and split are keyed by sha256(seed, prompt_hash), not by file
position, so a cap is a uniform sample rather than a file's head, and the same
params give byte-identical outputs. The held-out rows are the first
`heldout_rows` of that order; dedupe on prompt_hash guarantees no held-out
prompt also appears in training.
"""

import hashlib
import json
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from eagle3.chat.conversations import DROP_REASONS, InvalidRow, normalize, prompt_hash
from eagle3.errors import Eagle3Error
from eagle3.files import staged_dir, write_json
from eagle3.formats.hub_datasets import load_pinned
from eagle3.formats.prepared import SCHEMA, SCHEMA_NAME, SPLITS
from eagle3.hashing import sha256_bytes, sha256_file
from eagle3.params.base import StageParams
from eagle3.params.prepare import HubDataset, LocalDataset, PrepareParams
from eagle3.paths import PREPARED_CARD, PREPARED_DIR, prepared_split
from eagle3.progress import progress, status

_EXAMPLES_PER_REASON = 5
_BATCH_ROWS = 4096


@dataclass
class _Unreadable:
    """A raw record that could not even be parsed into a row."""

    reason: str


@dataclass
class _InputStats:
    rows_read: int = 0
    rows_valid: int = 0
    dropped: Counter = field(default_factory=Counter)
    # rows per sub-source (the rows' `source` field), and those left out by exclude_sub_sources
    sub_sources: Counter = field(default_factory=Counter)
    excluded: Counter = field(default_factory=Counter)


class Params(StageParams):
    prepare: PrepareParams


def _check_exclusions(source: LocalDataset | HubDataset, index: int, stats: _InputStats) -> None:
    """An excluded sub-source the data does not have is a misspelt id, which would let its rows through."""
    absent = [name for name in source.exclude_sub_sources if name not in stats.excluded]
    if absent:
        present = ", ".join(f"{name} ({rows:,})" for name, rows in stats.sub_sources.most_common(30)) or "none"
        raise Eagle3Error(
            f"prepare.sources[{index}].exclude_sub_sources: {', '.join(absent)} not among {source.name}'s sub-sources "
            f"(its rows' `source` field); it has: {present}"
        )


def run(params: Params, root: Path, options=None) -> None:
    config = params.prepare
    drops: Counter = Counter()
    drop_examples: dict[str, list[str]] = defaultdict(list)
    inputs: list[dict[str, Any]] = []
    candidates: dict[str, dict[str, Any]] = {}
    duplicates = 0
    with progress() as bar:
        for index, source in enumerate(config.sources):
            records, total, description = _open(source, root)
            task = bar.add_task(f"prepare {source.name}", total=total)
            stats = _InputStats()
            for position, record in enumerate(records, start=1):
                stats.rows_read += 1
                bar.advance(task)
                sub_source = record.get("source") if isinstance(record, dict) else None
                if isinstance(sub_source, str):
                    stats.sub_sources[sub_source] += 1
                    if sub_source in source.exclude_sub_sources:
                        stats.excluded[sub_source] += 1
                        continue
                try:
                    if isinstance(record, _Unreadable):
                        raise InvalidRow(record.reason)
                    messages = normalize(record)
                except InvalidRow as exc:
                    stats.dropped[exc.reason] += 1
                    if len(drop_examples[exc.reason]) < _EXAMPLES_PER_REASON:
                        drop_examples[exc.reason].append(f"{source.name} row {position}: {exc}")
                    continue
                stats.rows_valid += 1
                key = prompt_hash(messages)
                if key in candidates:
                    duplicates += 1
                    continue
                candidates[key] = {
                    "id": key[:16],
                    "source": sub_source if isinstance(sub_source, str) and sub_source.strip() else source.name,
                    "origin": source.name,
                    "prompt_hash": key,
                    "messages": messages,
                }
            drops.update(stats.dropped)
            _check_exclusions(source, index, stats)
            inputs.append(
                {
                    **description,
                    "name": source.name,
                    "license": source.license,
                    "max_rows": source.max_rows,
                    "rows_read": stats.rows_read,
                    "rows_valid": stats.rows_valid,
                    "dropped": dict(sorted(stats.dropped.items())),
                    **({"excluded": dict(sorted(stats.excluded.items()))} if source.exclude_sub_sources else {}),
                }
            )

    kept, capped = _apply_caps(config, sorted(candidates.values(), key=lambda row: _order_key(config.seed, row)))
    if len(kept) <= config.heldout_rows:
        raise Eagle3Error(
            f"prepare.heldout_rows: {config.heldout_rows} held-out rows would leave no training rows "
            f"(only {len(kept)} valid, unique rows after caps); lower it or add data"
        )
    splits = {"heldout": kept[: config.heldout_rows], "train": kept[config.heldout_rows :]}

    out = root / PREPARED_DIR
    with staged_dir(out) as staging:
        card = {
            "schema": SCHEMA_NAME,
            "inputs": inputs,
            "licenses": sorted({source.license for source in config.sources}),
            "rows_in": sum(item["rows_read"] for item in inputs),
            "rows_out": {name: len(rows) for name, rows in splits.items()},
            "dropped": {reason: drops[reason] for reason in DROP_REASONS if drops[reason]},
            "drop_examples": dict(sorted(drop_examples.items())),
            "duplicates": duplicates,
            "capped": dict(sorted(capped.items())),
            "split": {"seed": config.seed, "heldout_rows": config.heldout_rows, "keyed_by": "sha256(seed:prompt_hash)"},
            "by_source": _count_by_source(splits),
            "turns": _count_turns(splits),
            "files": {},
        }
        for name, rows in splits.items():
            path = staging / prepared_split(name).name
            pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path, compression="zstd")
            card["files"][f"{name}.parquet"] = {
                "sha256": sha256_file(path),
                "content_sha256": _content_sha256(rows),
                "rows": len(rows),
            }
        write_json(staging / PREPARED_CARD.name, card)
    status(
        f"prepared {card['rows_out']['train']} train + {card['rows_out']['heldout']} held-out rows "
        f"from {card['rows_in']} read ({sum(drops.values())} invalid, {duplicates} duplicates, "
        f"{sum(capped.values())} over caps) -> {PREPARED_DIR}"
    )


def _order_key(seed: int, row: dict[str, Any]) -> str:
    return hashlib.sha256(f"{seed}:{row['prompt_hash']}".encode()).hexdigest()


def _apply_caps(config: PrepareParams, ordered: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], Counter]:
    input_caps = {source.name: source.max_rows for source in config.sources}
    per_input: Counter = Counter()
    per_source: Counter = Counter()
    capped: Counter = Counter()
    kept: list[dict[str, Any]] = []
    for row in ordered:
        if (cap := input_caps[row["origin"]]) is not None and per_input[row["origin"]] >= cap:
            capped["input_max_rows"] += 1
        elif config.max_rows_per_source is not None and per_source[row["source"]] >= config.max_rows_per_source:
            capped["max_rows_per_source"] += 1
        elif config.max_rows is not None and len(kept) >= config.max_rows:
            capped["max_rows"] += 1
        else:
            kept.append(row)
            per_input[row["origin"]] += 1
            per_source[row["source"]] += 1
    return kept, capped


def _count_by_source(splits: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(SPLITS, 0))
    for name, rows in splits.items():
        for row in rows:
            counts[row["source"]][name] += 1
    return dict(sorted(counts.items()))


def _count_turns(splits: dict[str, list[dict[str, Any]]]) -> dict[str, int]:
    rows = [row for split in splits.values() for row in split]
    return {
        "user": sum(m["role"] == "user" for row in rows for m in row["messages"]),
        "assistant": sum(m["role"] == "assistant" for row in rows for m in row["messages"]),
        "multi_turn_rows": sum(sum(m["role"] == "user" for m in row["messages"]) > 1 for row in rows),
    }


def _content_sha256(rows: list[dict[str, Any]]) -> str:
    """Hash of the rows themselves, independent of parquet encoding or library version."""
    lines = (json.dumps(row, sort_keys=True, ensure_ascii=False) for row in rows)
    return sha256_bytes("\n".join(lines).encode("utf-8"))


def _open(source: LocalDataset | HubDataset, root: Path) -> tuple[Iterator[Any], int | None, dict[str, Any]]:
    """(records, total if known, description for the card) for one configured input."""
    if isinstance(source, HubDataset):
        return _open_hub(source)
    path = root / source.path
    if not path.is_file():
        raise Eagle3Error(f"prepare.sources[{source.name}].path: {path} not found")
    description = {"kind": "local", "path": source.path, "sha256": sha256_file(path)}
    if path.suffix == ".jsonl":
        with open(path, "rb") as handle:
            total = sum(1 for line in handle if line.strip())
        return _read_jsonl(path), total, description
    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise Eagle3Error(f"{path}: not a readable parquet file ({exc})") from None
    return _rows_from_batches(parquet.iter_batches(batch_size=_BATCH_ROWS)), parquet.metadata.num_rows, description


def _read_jsonl(path: Path) -> Iterator[Any]:
    with open(path, "rb") as handle:
        for raw in handle:
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                yield _Unreadable("undecodable_text")
                continue
            try:
                yield json.loads(text)
            except json.JSONDecodeError:
                yield _Unreadable("invalid_json")


def _rows_from_batches(batches: Iterator[pa.RecordBatch | pa.Table]) -> Iterator[Any]:
    for batch in batches:
        try:
            yield from batch.to_pylist()
        except UnicodeDecodeError:
            # One bad string fails the whole batch; retry row by row so only that row is lost.
            for index in range(batch.num_rows):
                try:
                    yield batch.slice(index, 1).to_pylist()[0]
                except UnicodeDecodeError:
                    yield _Unreadable("undecodable_text")


def _open_hub(source: HubDataset) -> tuple[Iterator[Any], int | None, dict[str, Any]]:
    dataset, description = load_pinned(
        source.dataset, source.config, source.revision, source.split, f"prepare.sources[{source.name}]"
    )
    return _rows_from_batches(dataset.with_format("arrow").iter(batch_size=_BATCH_ROWS)), len(dataset), description
