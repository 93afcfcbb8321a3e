"""evaluate's long-context probe: multi-turn conversations of held-out text, as long as the user asks.

Acceptance at long context is where draft layouts are reported to differ, and neither the held-out prompts (first
user turns) nor the benchmark sets reach it. Each probe chains whole held-out conversations, every user turn with
the verifier's own answer to it (generate's held-out split), into one history, then asks the first user turn of
the next held-out conversation: a long chat session on topics the draft never trained on. The history takes as
many conversations as keep the rendered prompt within `context_tokens`. Probes take the conversations in turn,
wrapping round when the split runs out, so they overlap only when the split is smaller than the probes need;
a probe never holds one conversation twice.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from eagle3.errors import Eagle3Error
from eagle3.formats.synthetic import SyntheticRecord

# messages -> the prompt's tokens as the engine renders (chat template, generation prompt) and tokenizes it.
PromptTokens = Callable[[list[dict[str, str]]], int]


@dataclass(frozen=True)
class Probe:
    messages: list[dict[str, str]]
    prompt_tokens: int
    # The held-out conversations of the history, then the one asked, in order.
    prompt_hashes: list[str]


def answered_turns(record: SyntheticRecord) -> list[dict[str, str]]:
    """A regenerated conversation's user and assistant turns up to its last answer (system turns left out: a chat
    template takes one only first, and the chained histories have several)."""
    messages = [{"role": m["role"], "content": m["content"]} for m in record["messages"] if m["role"] != "system"]
    while messages and messages[-1]["role"] != "assistant":
        messages.pop()
    return messages


def long_context_probes(
    records: Sequence[SyntheticRecord], count: int, context_tokens: int, prompt_tokens: PromptTokens
) -> list[Probe]:
    """`count` probes from the held-out split's regenerated `records` (see module doc)."""
    pool = [(r["prompt_hash"], answered_turns(r)) for r in records if r["status"] == "ok"]
    pool = [(digest, turns) for digest, turns in pool if turns]
    if len(pool) < 2:
        raise Eagle3Error(
            f"evaluate.long_context: {len(pool)} answered held-out conversations, a probe needs 2 (one history, "
            "one question); raise prepare.heldout_rows or set evaluate.long_context: null"
        )
    probes: list[Probe] = []
    start, skipped = 0, 0
    while len(probes) < count:
        probe = _longest_fitting(pool, start, context_tokens, prompt_tokens)
        if probe is None:
            skipped += 1
            if skipped == len(pool):
                raise Eagle3Error(
                    f"evaluate.long_context.context_tokens: {context_tokens} tokens hold no held-out conversation "
                    "followed by a question; raise it (and evaluate.vllm.max_model_len with it)"
                )
            start = (start + 1) % len(pool)
            continue
        skipped = 0
        probes.append(probe)
        start = (start + len(probe.prompt_hashes)) % len(pool)
    return probes


def _longest_fitting(pool, start: int, context_tokens: int, prompt_tokens: PromptTokens) -> Probe | None:
    """The probe with the most conversations from `start` on whose prompt fits; None if not even one fits. The
    search doubles, then bisects, the number of conversations: a few renders per probe, however long."""

    def make(conversations: int) -> Probe:
        chosen = [pool[(start + i) % len(pool)] for i in range(conversations + 1)]
        history = [message for _, turns in chosen[:-1] for message in turns]
        messages = history + [chosen[-1][1][0]]
        return Probe(messages, prompt_tokens(messages), [digest for digest, _ in chosen])

    most = len(pool) - 1
    fitting = make(1)
    if fitting.prompt_tokens > context_tokens:
        return None
    low, high = 1, None
    while high is None:
        trial = min(2 * low, most)
        if trial == low:
            return fitting
        candidate = make(trial)
        if candidate.prompt_tokens > context_tokens:
            high = trial
        else:
            low, fitting = trial, candidate
    while high - low > 1:
        middle = (low + high) // 2
        candidate = make(middle)
        if candidate.prompt_tokens > context_tokens:
            high = middle
        else:
            low, fitting = middle, candidate
    return fitting
