"""Reasoning ("thinking") text in assistant turns: detect it, and hand it to chat templates as vLLM serving does.

Two shapes reach us. A server with a reasoning parser returns it in a separate
field (`reasoning`, formerly `reasoning_content`); a model served without one
returns it inline, as `<think>...</think>` at the start of the content. Both are
kept as the verifier produced them: the separate field in the turn's
`reasoning`, the inline form untouched in `content`. A third comes from the
offline engines when the template itself opens the block in the generation
prompt (Kimi-K2.5, DeepSeek-R1: the prompt ends in `<think>`): the answer
starts inside the reasoning, and `split_opened_reasoning` splits it the way
vLLM's reasoning parsers do, so the rendered turn is the text the verifier
generated rather than `<think></think>` plus its reasoning as the answer. When a conversation is
rendered, assistant turns carry both `reasoning` and `reasoning_content`, the
two names vLLM's renderer gives chat templates, so each template keeps or drops
the reasoning exactly as it does in serving.
"""

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# A conversation's messages ({role, content, reasoning?}) as their holders have them: plain dicts, or a synthetic
# record's (eagle3/formats/synthetic.py). Only read here.
Messages = Sequence[Mapping[str, Any]]

_INLINE = re.compile(r"^\s*<think>(.*?)</think>", re.DOTALL)


def inline_reasoning(content: str) -> str | None:
    match = _INLINE.match(content)
    return match[1] if match else None


THINK_END = "</think>"


def opens_reasoning(prompt: str) -> bool:
    """The rendered generation prompt ends inside an open `<think>` block: the answer begins with reasoning."""
    return prompt.rfind("<think>") > prompt.rfind(THINK_END)


def decode(tokenizer: "PreTrainedTokenizerBase", token_ids: list[int]) -> str:
    """The text of `token_ids`, special tokens left out (one sequence decodes to one string)."""
    text = tokenizer.decode(token_ids, skip_special_tokens=True)
    if not isinstance(text, str):
        raise TypeError(f"the tokenizer decoded one sequence to {type(text).__name__}, not str")
    return text


def split_opened_reasoning(tokenizer: "PreTrainedTokenizerBase", token_ids: list[int], text: str) -> tuple[str, str]:
    """(content, reasoning) of an answer generated after an opened `<think>`: reasoning up to the first `</think>`,
    content after it; an answer that never closes the block (cut at max_tokens) is all reasoning. Split on the
    token ids where `</think>` is one token, since it may be a special token the decoded `text` leaves out."""
    end = tokenizer.convert_tokens_to_ids(THINK_END)
    if isinstance(end, int) and tokenizer.convert_ids_to_tokens(end) == THINK_END:
        if end not in token_ids:
            return "", text
        cut = token_ids.index(end)
        return decode(tokenizer, token_ids[cut + 1 :]), decode(tokenizer, token_ids[:cut])
    reasoning, closed, content = text.partition(THINK_END)
    return (content, reasoning) if closed else ("", text)


def reasoning_format(content: str, reasoning: str | None) -> str | None:
    if reasoning:
        return "field"
    return "inline" if inline_reasoning(content) is not None else None


def template_messages(messages: Messages) -> list[dict[str, Any]]:
    """Messages as a chat template sees them in vLLM serving."""
    rendered = []
    for message in messages:
        item = {"role": message["role"], "content": message["content"]}
        if message["role"] == "assistant" and message.get("reasoning"):
            item["reasoning"] = item["reasoning_content"] = message["reasoning"]
        rendered.append(item)
    return rendered


def render(
    tokenizer: "PreTrainedTokenizerBase",
    messages: Messages,
    add_generation_prompt: bool = False,
    template_kwargs: dict[str, Any] | None = None,
) -> str:
    text = tokenizer.apply_chat_template(
        template_messages(messages),
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        **(template_kwargs or {}),
    )
    if not isinstance(text, str):  # tokenize=False renders text
        raise TypeError(f"the chat template rendered {type(text).__name__}, not str")
    return text


def template_renders_reasoning(model_dir: Path, trust_remote_code: bool) -> bool:
    """Whether the verifier's chat template has a place for reasoning (a reasoning model's), by its source text."""
    from transformers import AutoTokenizer

    template = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code).chat_template or ""
    sources = template.values() if isinstance(template, dict) else [template]
    return any("reasoning_content" in source or "<think>" in source for source in sources)
