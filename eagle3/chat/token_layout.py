"""Regenerated conversation -> token ids + loss mask, using the verifier's own chat template.

The loss mask marks what the verifier generated: each assistant turn's text
(reasoning included, as the template renders it) up to and including its
end-of-turn token (the special token the template writes after a turn, e.g.
`<|im_end|>`; not necessarily the tokenizer's EOS: Kimi's `[EOS]` is another).
A turn cut at generate's max_tokens never generated that token: its mask
stops after the tokens it generated, and, when it was cut before any content
(still inside its reasoning), at the first special token, the `</think>` the
template closes the unfinished block with.
Spans come from the template itself, not from a hard-coded header string: for
assistant turn i, the text between render(messages[:i],
add_generation_prompt=True) and render(messages[:i+1]); a template whose turn
does not extend its generation prompt is refused with one line. Token ids come
from tokenizing the text piece by piece at those boundaries (the prompt, each
generated turn), as the verifier saw them, so no offset mapping is needed:
slow tokenizers (Kimi's tiktoken one) have none.

When the template renders history the same way at every turn (the rendered
conversation extends each turn's render), the conversation is one sequence
with every assistant span masked. When it does not (e.g. templates that drop
earlier turns' reasoning), each assistant turn becomes its own sequence, the
exact context the verifier saw when it generated that turn, with only that
turn masked.
"""

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from eagle3.chat.reasoning import Messages, render
from eagle3.errors import Eagle3Error

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class Cut:
    """An assistant turn generate cut at max_tokens: how many tokens it generated, and whether it was cut before
    any content (inside its reasoning, or having produced only special tokens, which decode to nothing)."""

    generated_tokens: int
    before_content: bool


@dataclass
class Sequence:
    sample_id: str
    input_ids: torch.Tensor  # int64 [tokens]
    loss_mask: torch.Tensor  # bool [tokens]
    truncated: bool


def layout(
    tokenizer: "PreTrainedTokenizerBase",
    sample_id: str,
    messages: Messages,
    max_seq_len: int,
    template_kwargs: dict[str, Any] | None = None,
    turn_records: Collection[Mapping[str, Any]] | None = None,
) -> list[Sequence]:
    """`template_kwargs`: what generate passed to the chat template (the record's chat_template_kwargs);
    `turn_records`: the record's `turns`, one per assistant turn (finish_reason, completion_tokens)."""

    def render_turns(upto: int, add_generation_prompt: bool = False) -> str:
        return render(tokenizer, messages[:upto], add_generation_prompt, template_kwargs)

    assistant_turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not assistant_turns:
        return []
    end_of_turn = end_of_turn_id(tokenizer, template_kwargs)
    if turn_records is not None and len(turn_records) != len(assistant_turns):
        raise Eagle3Error(
            f"{sample_id}: {len(assistant_turns)} assistant turns but {len(turn_records)} turn records; the "
            "synthetic record is damaged: regenerate it (delete its part under data/synthetic and rerun generate)"
        )
    cut_at: list[Cut | None] = [None] * len(assistant_turns)
    for number, record in enumerate(turn_records or []):
        if record["finish_reason"] == "length":
            content = messages[assistant_turns[number]]["content"]
            cut_at[number] = Cut(record["completion_tokens"], before_content=content == "")
    full = render_turns(len(messages))
    turns = []
    for number, turn in enumerate(assistant_turns):
        before, through = render_turns(turn, add_generation_prompt=True), render_turns(turn + 1)
        if not through.startswith(before):
            raise Eagle3Error(
                f"{sample_id}: the chat template renders assistant turn {number} otherwise than the generation prompt "
                "it was generated from (the render with add_generation_prompt=True of the turns before it is not a "
                "prefix of the render through it), so the generated tokens cannot be located; fix the template "
                "(or generate.chat_template_kwargs) so that a turn extends its generation prompt"
            )
        turns.append((before, through, cut_at[number]))
    if all(full.startswith(through) for _, through, _ in turns):
        spans = [(len(before), len(through), cut) for before, through, cut in turns]
        return [_sequence(tokenizer, sample_id, full, spans, end_of_turn, max_seq_len)]
    # The template renders history otherwise than the turn saw it (e.g. it drops earlier turns' reasoning): each
    # turn alone, in the exact context it was generated in.
    return [
        _sequence(
            tokenizer, f"{sample_id}#{number}", through, [(len(before), len(through), cut)], end_of_turn, max_seq_len
        )
        for number, (before, through, cut) in enumerate(turns)
    ]


_END_OF_TURN: dict[tuple[int, str], tuple[Any, int | None]] = {}


def end_of_turn_id(tokenizer: "PreTrainedTokenizerBase", template_kwargs: dict[str, Any] | None = None) -> int | None:
    """The token that ends an assistant turn, as the chat template writes it: the first token after a turn's content
    when it is a special token (`<|im_end|>`, `<|eot_id|>`; Kimi's `[EOS]` is not it), else the tokenizer's EOS."""
    key = (id(tokenizer), json.dumps(template_kwargs or {}, sort_keys=True))
    if key not in _END_OF_TURN:
        marker = "Done."
        probe = [{"role": "user", "content": "Ready?"}, {"role": "assistant", "content": marker}]
        rendered = render(tokenizer, probe, template_kwargs=template_kwargs)
        after = rendered[rendered.rindex(marker) + len(marker) :]
        ids = tokenizer(after, add_special_tokens=False)["input_ids"] if after else []
        found = ids[0] if ids and ids[0] in set(tokenizer.all_special_ids) else tokenizer.eos_token_id
        _END_OF_TURN[key] = (tokenizer, found)  # the tokenizer is kept so its id is never reused
    return _END_OF_TURN[key][1]


def _sequence(
    tokenizer: "PreTrainedTokenizerBase",
    sample_id: str,
    text: str,
    spans: list[tuple[int, int, Cut | None]],
    end_of_turn: int | None,
    max_seq_len: int,
) -> Sequence:
    """Token ids of `text` tokenized piece by piece, cut at the span boundaries: the prompt as it was sent and each
    generated turn on its own, which is how the verifier saw them and needs no offset mapping (slow tokenizers,
    Kimi's among them, have none). Masked: each span's tokens up to and including its end-of-turn token; template
    text after it (a newline) is never generated by the verifier. A span cut at max_tokens (its third item) is
    masked for at most the tokens it generated, never through its end-of-turn token, and, cut before any content,
    never through a special token."""
    ids: list[int] = []
    mask: list[bool] = []
    special = set(tokenizer.all_special_ids)
    cursor = 0
    for start, end, cut in spans:
        for piece, generated in ((text[cursor:start], False), (text[start:end], True)):
            piece_ids = tokenizer(piece, add_special_tokens=False)["input_ids"] if piece else []
            stop = len(piece_ids)
            if generated and end_of_turn in piece_ids:
                stop = piece_ids.index(end_of_turn) + (0 if cut is not None else 1)
            if generated and cut is not None:
                stop = min(stop, cut.generated_tokens)
                if cut.before_content:
                    stop = next((i for i, token in enumerate(piece_ids[:stop]) if token in special), stop)
            ids += piece_ids
            mask += [generated and position < stop for position in range(len(piece_ids))]
        cursor = end
    tail = tokenizer(text[cursor:], add_special_tokens=False)["input_ids"] if cursor < len(text) else []
    ids += tail
    mask += [False] * len(tail)
    return Sequence(
        sample_id,
        torch.tensor(ids[:max_seq_len], dtype=torch.int64),
        torch.tensor(mask[:max_seq_len], dtype=torch.bool),
        len(ids) > max_seq_len,
    )
