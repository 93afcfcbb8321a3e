"""One conversation schema for the whole pipeline, and the rules that make a row valid.

Accepted inputs: ShareGPT / open-perfectblend ``conversations: [{from, value}]``
and OpenAI ``messages: [{role, content}]``. Output: ``[{role, content}]`` with
roles system | user | assistant, an optional system turn first, then user and
assistant strictly alternating, starting with user.
"""

import hashlib
import re
import unicodedata

ROLE_ALIASES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "model": "assistant",
}

# Why a row can be rejected; prepare counts each one in the dataset card.
DROP_REASONS = (
    "invalid_json",
    "not_an_object",
    "missing_field",
    "malformed_turn",
    "empty_conversation",
    "empty_turn",
    "bad_role",
    "undecodable_text",
    "bad_turn_order",
)


class InvalidRow(Exception):
    def __init__(self, reason: str, detail: str = ""):
        assert reason in DROP_REASONS, reason
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def normalize(row: object) -> list[dict[str, str]]:
    """Validate a raw row and return its turns as [{role, content}]; raise InvalidRow saying why not."""
    if not isinstance(row, dict):
        raise InvalidRow("not_an_object", type(row).__name__)
    if isinstance(row.get("conversations"), list):
        turns, role_key, text_key = row["conversations"], "from", "value"
    elif isinstance(row.get("messages"), list):
        turns, role_key, text_key = row["messages"], "role", "content"
    else:
        raise InvalidRow("missing_field", "no `conversations` or `messages` list")
    if not turns:
        raise InvalidRow("empty_conversation")
    messages = [_turn(turn, role_key, text_key) for turn in turns]
    _check_order([m["role"] for m in messages])
    return messages


def _turn(turn: object, role_key: str, text_key: str) -> dict[str, str]:
    if not isinstance(turn, dict) or role_key not in turn or text_key not in turn:
        raise InvalidRow("malformed_turn", f"expected {{{role_key}, {text_key}}}")
    raw_role, text = turn[role_key], turn[text_key]
    role = ROLE_ALIASES.get(raw_role.strip().lower()) if isinstance(raw_role, str) else None
    if role is None:
        raise InvalidRow("bad_role", repr(raw_role))
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidRow("undecodable_text", str(exc)) from None
    if not isinstance(text, str):
        raise InvalidRow("malformed_turn", f"{text_key} is {type(text).__name__}, not text")
    problem = damaged_text(text)
    if problem:
        raise InvalidRow("undecodable_text", problem)
    if not text.strip():
        raise InvalidRow("empty_turn", role)
    return {"role": role, "content": text}


def damaged_text(text: str) -> str | None:
    """Why `text` is damaged, or None. Lone surrogates (from bad \\ud800 escapes) and U+FFFD (bytes already lost
    upstream) both mean damaged text."""
    if "\ufffd" in text:
        return "contains U+FFFD replacement characters"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains lone surrogates"
    return None


def _check_order(roles: list[str]) -> None:
    body = roles[1:] if roles[0] == "system" else roles
    if not body:
        raise InvalidRow("bad_turn_order", "only a system turn")
    for index, role in enumerate(body):
        expected = "user" if index % 2 == 0 else "assistant"
        if role != expected:
            raise InvalidRow("bad_turn_order", f"turn {index + 1} is {role}, expected {expected}")


_SPACE = re.compile(r"\s+")


def prompt_hash(messages: list[dict[str, str]]) -> str:
    """Identity of a conversation's prompt side (system + user turns), insensitive to case, width and spacing.

    Assistant turns are left out on purpose: the verifier regenerates them, so
    two rows that differ only in their answers are the same training input.
    """
    parts = []
    for message in messages:
        if message["role"] != "assistant":
            text = _SPACE.sub(" ", unicodedata.normalize("NFKC", message["content"]).casefold()).strip()
            parts.append(f"{message['role']}\x1f{text}")
    return hashlib.sha256("\x1e".join(parts).encode("utf-8")).hexdigest()
