"""How a benchmark record becomes the user turns of a conversation, and the messages of each turn.

FORMATS is the one table of record layouts `benchmarks.sets[].format` may name. A multi-turn record (MT-bench) is
asked turn by turn: turn t's messages are its first t+1 user turns with, between them, the answers to the earlier
turns. evaluate gives every method the same answers, the verifier's own greedy ones (the `none` run), so each
method is measured on the same conversation.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from eagle3.chat.conversations import damaged_text

# HumanEval's prompt is a function signature and docstring for a completion model; a chat model is asked for the
# function (the way chat-model evaluations of HumanEval pose it).
CODE_INSTRUCTION = "Complete the following Python function. Reply with the whole function in one Python code block."


class InvalidRecord(ValueError):
    """A record that does not have the layout its set's format names."""


def _checked(value: object, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidRecord(f"{where} must be a non-empty string, got {type(value).__name__}")
    problem = damaged_text(value)
    if problem:
        raise InvalidRecord(f"{where} {problem}")
    return value


def _turns(record: dict[str, Any]) -> list[str]:
    turns = record.get("turns")
    if not isinstance(turns, list) or not turns:
        raise InvalidRecord(f"field 'turns' must be a non-empty list of strings, got {type(turns).__name__}")
    return [_checked(turn, f"turns[{index}]") for index, turn in enumerate(turns)]


def _code(record: dict[str, Any]) -> str:
    return _checked(record.get("prompt"), "field 'prompt'")


def _code_completion(record: dict[str, Any]) -> list[str]:
    code = _code(record)
    return [f"{CODE_INSTRUCTION}\n\n```python\n{code}{'' if code.endswith(chr(10)) else chr(10)}```"]


def _question(record: dict[str, Any]) -> str:
    return _checked(record.get("question"), "field 'question'")


@dataclass(frozen=True)
class Format:
    fields: str  # what the record must hold: named in every error about a record of this format
    user_turns: Callable[[dict[str, Any]], list[str]]
    # The record's own text as a training prompt would hold it, beside the asked turns, for the overlap check
    # (HumanEval's function without the instruction around it).
    raw_text: Callable[[dict[str, Any]], str]


FORMATS: dict[str, Format] = {
    "turns": Format(
        "turns: [str, ...] (MT-bench: each asked after the answer to the previous)",
        _turns,
        lambda record: _turns(record)[0],
    ),
    "code-completion": Format(
        "prompt: str, a function to complete (HumanEval), asked with CODE_INSTRUCTION", _code_completion, _code
    ),
    "question": Format("question: str (GSM8K)", lambda record: [_question(record)], _question),
}


def user_turns(record: object, format_name: str) -> tuple[list[str], str]:
    """(the user turns to ask, the record's own text) of a record in format `format_name`."""
    if not isinstance(record, dict):
        raise InvalidRecord(f"must be a JSON object, got {type(record).__name__}")
    layout = FORMATS[format_name]
    return layout.user_turns(record), layout.raw_text(record)


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
