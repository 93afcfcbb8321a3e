"""Asking conversations turn by turn on any engine: evaluate's in-process vLLM (eagle3/engines/speculative.py) and
running servers (eagle3/engines/measurers.py, ServerMeasurer) share this loop.

Every conversation's turn t goes in one batch per sampling setting, t = 0, 1, ...; turn t > 0 follows the answers
given for the earlier turns (the reference's, eagle3/chat/benchmark_prompts.py), or, given none, the answers of
sampling 0, which must then be the greedy one. Given a kept item (eagle3/formats/evaluation_kept.py), a batch it
holds for the same messages is taken from it instead of asked, and each batch asked is kept as it finishes.
"""

from collections.abc import Callable
from typing import Any

from eagle3.chat.benchmark_prompts import follow_up_messages
from eagle3.formats.evaluation_kept import KeptItem, messages_sha256

# ask(messages of one batch, sampling index) -> (completions in that order, counters of that batch, its seconds)
Ask = Callable[[list[list[dict[str, str]]], int], tuple[list[dict[str, Any]], dict[str, Any], float]]


def ask_turn_by_turn(
    prompts: list[list[dict[str, str]]],
    later: list[list[str]],
    given: list[list[str]] | None,
    samplings: int,
    ask: Ask,
    kept: KeptItem | None = None,
) -> list[dict[str, Any]]:
    """Per sampling: completions tagged with their conversation and turn, the batches' seconds and summed
    counters."""
    later = later or [[] for _ in prompts]
    own: list[list[str]] = [[] for _ in prompts]
    results: list[dict[str, Any]] = [{"seconds": 0.0, "completions": [], "counters": None} for _ in range(samplings)]
    for turn in range(1 + max(map(len, later), default=0)):
        asked = [i for i in range(len(prompts)) if len(later[i]) >= turn]
        for number, result in enumerate(results):
            history = given if given is not None else own
            messages = [follow_up_messages(prompts[i], later[i], history[i], turn) for i in asked]
            completions, counters, seconds = _asked_or_kept(ask, kept, messages, number, turn)
            result["seconds"] = round(result["seconds"] + seconds, 3)
            result["counters"] = _add_counters(result["counters"], counters)
            for i, completion in zip(asked, completions, strict=True):
                result["completions"].append({"conversation": i, "turn": turn, **completion})
                if number == 0 and given is None:
                    own[i].append(completion["text"])
    return results


def _asked_or_kept(ask: Ask, kept: KeptItem | None, messages, number: int, turn: int):
    if kept is None:
        return ask(messages, number)
    sha = messages_sha256(messages)
    batch = kept.batch(number, turn, sha)
    if batch is None:
        completions, counters, seconds = ask(messages, number)
        batch = {"completions": completions, "counters": counters, "seconds": seconds}
        kept.keep_batch(number, turn, sha, batch)
    return batch["completions"], batch["counters"], batch["seconds"]


def _add_counters(total: dict[str, Any] | None, batch: dict[str, Any]) -> dict[str, Any]:
    """Counter deltas of two batches summed, per-position lists element by element."""
    if total is None:
        return dict(batch)
    summed: dict[str, Any] = {}
    for key, value in batch.items():
        if isinstance(value, list):
            ours = total.get(key) or []
            width = max(len(ours), len(value))
            summed[key] = [
                (ours[i] if i < len(ours) else 0) + (value[i] if i < len(value) else 0) for i in range(width)
            ]
        else:
            summed[key] = total.get(key, 0) + value
    return summed
