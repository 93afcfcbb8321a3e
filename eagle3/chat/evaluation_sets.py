"""The prompt sets evaluate asks, as conversations: the held-out split's first user turns (refused where any is also a
training prompt) and each benchmark of data/benchmarks, turn by turn. Read by the evaluate stage and by `eagle3
plan`, which counts the turns each server is asked."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3.errors import Eagle3Error
from eagle3.formats.benchmarks import read_benchmarks
from eagle3.formats.prepared import read_rows
from eagle3.params.evaluate import EvaluateParams
from eagle3.paths import PREPARED_DIR, prepared_split


def heldout_prompts(root: Path, limit: int | None) -> tuple[list[str], list[list[dict[str, str]]]]:
    """(prompt hashes, chat prompts) of the held-out split; refuses any prompt that training also saw."""
    heldout = read_rows(root, "heldout")
    train = {row["prompt_hash"] for row in read_rows(root, "train", columns=["prompt_hash"])}
    leaked = [row["id"] for row in heldout if row["prompt_hash"] in train]
    if leaked:
        raise Eagle3Error(
            f"{root / PREPARED_DIR}: {len(leaked)} held-out prompts are also training prompts "
            f"(e.g. {leaked[0]}); rerun `eagle3 prepare`"
        )
    hashes, prompts = [], []
    for row in heldout[:limit]:
        messages = []
        for message in row["messages"]:
            if message["role"] == "assistant":
                break
            messages.append({"role": message["role"], "content": message["content"]})
        if messages and messages[-1]["role"] == "user":
            hashes.append(row["prompt_hash"])
            prompts.append(messages)
    if not prompts:
        raise Eagle3Error(f"{root / prepared_split('heldout')}: no held-out prompts; set prepare.heldout_rows >= 1")
    return hashes, prompts


@dataclass(frozen=True)
class PromptSet:
    name: str
    # Each: {"id", "category", "first" (chat messages of the first turn), "later" (the user turns after it)}.
    conversations: list[dict[str, Any]]
    # A benchmark's facts for the metrics: license, records read, dropped as training prompts, over the cap.
    facts: dict[str, Any] = field(default_factory=dict)


def prompt_sets(root: Path, config: EvaluateParams) -> list[PromptSet]:
    """The held-out set first, then each benchmark set in data/benchmarks' order."""
    hashes, prompts = heldout_prompts(root, config.max_prompts)
    sets = [
        PromptSet(
            "heldout",
            [{"id": h, "category": None, "first": p, "later": []} for h, p in zip(hashes, prompts, strict=True)],
        )
    ]
    for entry in read_benchmarks(root):
        conversations = [
            {
                "id": prompt["id"],
                "category": prompt["category"],
                "first": [{"role": "user", "content": prompt["turns"][0]}],
                "later": prompt["turns"][1:],
            }
            for prompt in entry["prompts"]
        ]
        facts = {
            "license": entry["license"],
            "records": entry["records"],
            "contaminated": entry["contaminated"]["count"],
            "capped": entry["capped"],
        }
        sets.append(PromptSet(entry["name"], conversations, facts))
    return sets
