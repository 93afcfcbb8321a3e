"""What the generate stage and its backends exchange: turn requests and results, and the conversations being
regenerated turn by turn (each turn conditioned on the verifier's own earlier answers).

A backend takes parts (`Chunk`s) and calls `on_done(chunk)` once every conversation in a part is finished; how it
schedules the turns is its own business (batch engines use `drive_batched`, the servers backend keeps requests
in flight across parts).
"""

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from eagle3.chat.reasoning import reasoning_format


@dataclass
class TurnRequest:
    messages: list[dict[str, Any]]
    seed: int


@dataclass
class TurnResult:
    content: str
    reasoning: str | None
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int


@dataclass
class Skip:
    """A sample the verifier cannot answer (e.g. prompt longer than its context): counted, never retried."""

    reason: str


class Conversation:
    """One prepared row being regenerated turn by turn."""

    def __init__(self, row: dict[str, Any], turns: str, sampling_seed: int):
        self.row = row
        self.sampling_seed = sampling_seed
        messages = row["messages"]
        if turns == "all":
            prompt_side = [m for m in messages if m["role"] != "assistant"]
            first_user = next(i for i, m in enumerate(prompt_side) if m["role"] == "user")
            self.messages = prompt_side[: first_user + 1]
            self.upcoming_users = prompt_side[first_user + 1 :]
        else:
            last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
            self.messages = list(messages[: last_user + 1])
            self.upcoming_users = []
        self.turns: list[dict[str, Any]] = []
        self.skip_reason: str | None = None
        self.truncated_reason: str | None = None

    @property
    def needs_turn(self) -> bool:
        return self.skip_reason is None and self.messages[-1]["role"] == "user"

    def request(self) -> TurnRequest:
        key = f"{self.sampling_seed}:{self.row['id']}:{len(self.turns)}".encode()
        return TurnRequest(messages=self.messages, seed=int(hashlib.sha256(key).hexdigest()[:8], 16) & 0x7FFFFFFF)

    def accept(self, result: TurnResult | Skip) -> None:
        if isinstance(result, Skip):
            if self.turns:
                # Earlier turns are good data: keep them, end the conversation before the turn that cannot fit.
                self.messages = self.messages[:-1]
                self.upcoming_users = []
                self.truncated_reason = result.reason
            else:
                self.skip_reason = result.reason
            return
        self.messages = [
            *self.messages,
            {"role": "assistant", "content": result.content, "reasoning": result.reasoning},
        ]
        self.turns.append(
            {
                "finish_reason": result.finish_reason,
                "prompt_tokens": result.prompt_tokens,
                "completion_tokens": result.completion_tokens,
                "reasoning_format": reasoning_format(result.content, result.reasoning),
            }
        )
        if self.upcoming_users:
            self.messages.append(self.upcoming_users.pop(0))

    def record(self, common: dict[str, Any]) -> dict[str, Any]:
        return {
            **{key: self.row[key] for key in ("id", "source", "origin", "prompt_hash")},
            "status": "skipped" if self.skip_reason else "ok",
            "skip_reason": self.skip_reason,
            "truncated_reason": self.truncated_reason,
            "messages": self.messages if not self.skip_reason else self.row["messages"],
            "turns": self.turns,
            **common,
        }


@dataclass
class Chunk:
    split: str
    index: int
    conversations: list[Conversation]


def drive_batched(
    chunks: Iterable[Chunk],
    generate: Callable[[list[TurnRequest]], list[TurnResult | Skip]],
    on_done: Callable[[Chunk], None],
) -> None:
    """For batch engines: each part is one batch, turn by turn, so its output never depends on other parts."""
    for chunk in chunks:
        while pending := [c for c in chunk.conversations if c.needs_turn]:
            for conversation, result in zip(pending, generate([c.request() for c in pending]), strict=True):
                conversation.accept(result)
        on_done(chunk)


class GenerationBackend(Protocol):
    def process(self, chunks: Iterable[Chunk], on_done: Callable[[Chunk], None]) -> None: ...

    def environment(self) -> dict[str, Any]:
        """What the generate stage's environment record cannot see from this process (e.g. the servers')."""
        ...

    def close(self) -> None: ...
