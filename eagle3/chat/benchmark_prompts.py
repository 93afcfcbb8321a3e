"""How a benchmark record becomes the user turns of a conversation, and the messages of each turn.

FORMATS is the one table of record layouts `benchmarks.sets[].format` may name. A multi-turn record (MT-bench) is
asked turn by turn: turn t's messages are its first t+1 user turns with, between them, the answers to the earlier
turns. evaluate gives every method the same answers, the verifier's own greedy ones (the `none` run), so each
method is measured on the same conversation.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# HumanEval's prompt is a function signature and docstring for a completion model; a chat model is asked for the
# function (the way chat-model evaluations of HumanEval pose it).
CODE_INSTRUCTION = "Complete the following Python function. Reply with the whole function in one Python code block."


class InvalidRecord(ValueError):
    """A record that does not have the layout its set's format names."""


def _text(record: dict[str, Any], key: str) -> str:
    value = record.get(key)
    if not isinstance(value, str) or not value.strip():
        raise InvalidRecord(f"field {key!r} must be a non-empty string, got {type(value).__name__}")
    return value


def _turns(record: dict[str, Any]) -> list[str]:
    turns = record.get("turns")
    if not isinstance(turns, list) or not turns:
        raise InvalidRecord(f"field 'turns' must be a non-empty list of strings, got {type(turns).__name__}")
    for index, turn in enumerate(turns):
        if not isinstance(turn, str) or not turn.strip():
            raise InvalidRecord(f"turns[{index}] must be a non-empty string, got {type(turn).__name__}")
    return list(turns)


def _code_completion(record: dict[str, Any]) -> list[str]:
    return [f"{CODE_INSTRUCTION}\n\n```python\n{_text(record, 'prompt')}```"]


def _question(record: dict[str, Any]) -> list[str]:
    return [_text(record, "question")]


@dataclass(frozen=True)
class Format:
    fields: str  # what the record must hold, for messages and the README
    user_turns: Callable[[dict[str, Any]], list[str]]


FORMATS: dict[str, Format] = {
    "turns": Format("turns: [str, ...] (MT-bench: each asked after the answer to the previous)", _turns),
    "code-completion": Format(
        "prompt: str, a function to complete (HumanEval), asked with CODE_INSTRUCTION", _code_completion
    ),
    "question": Format("question: str (GSM8K)", _question),
}


def user_turns(record: Any, format_name: str) -> list[str]:
    if not isinstance(record, dict):
        raise InvalidRecord(f"must be a JSON object, got {type(record).__name__}")
    return FORMATS[format_name].user_turns(record)


def follow_up_messages(
    first: list[dict[str, str]], later: list[str], answers: list[str], turn: int
) -> list[dict[str, str]]:
    """The messages that ask turn `turn` (0: the first, `first` itself) of a conversation whose later user turns
    are `later`: each earlier turn followed by its answer from `answers`."""
    if len(answers) < turn:
        raise ValueError(f"turn {turn} needs the answers to the {turn} earlier turns, got {len(answers)}")
    messages = list(first)
    for index in range(turn):
        messages += [{"role": "assistant", "content": answers[index]}, {"role": "user", "content": later[index]}]
    return messages


# ask(messages of one batch, sampling index) -> (completions in that order, counters of that batch)
Ask = Callable[[list[list[dict[str, str]]], int], tuple[list[dict[str, Any]], dict[str, Any]]]


def ask_turn_by_turn(
    prompts: list[list[dict[str, str]]],
    later: list[list[str]],
    given: list[list[str]] | None,
    samplings: int,
    ask: Ask,
) -> list[dict[str, Any]]:
    """Every conversation's turn t in one batch per sampling, t = 0, 1, ...; per sampling: completions tagged with
    their conversation and turn, seconds and summed counters. Turn t > 0 follows the `given` answers, or (None)
    the answers of sampling 0, which must then be the greedy one."""
    later = later or [[] for _ in prompts]
    own: list[list[str]] = [[] for _ in prompts]
    results = [{"seconds": 0.0, "completions": [], "counters": None} for _ in range(samplings)]
    for turn in range(1 + max(map(len, later), default=0)):
        asked = [i for i in range(len(prompts)) if len(later[i]) >= turn]
        for number, result in enumerate(results):
            history = given if given is not None else own
            messages = [follow_up_messages(prompts[i], later[i], history[i], turn) for i in asked]
            started = time.monotonic()
            completions, counters = ask(messages, number)
            result["seconds"] = round(result["seconds"] + time.monotonic() - started, 3)
            result["counters"] = _add_counters(result["counters"], counters)
            for i, completion in zip(asked, completions, strict=True):
                result["completions"].append({"conversation": i, "turn": turn, **completion})
                if number == 0 and given is None:
                    own[i].append(completion["text"])
    return results


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
