"""Last-resort fallback: transformers `generate` on the CPU, batched with left padding (much slower than vLLM)."""

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from eagle3.chat.reasoning import decode, opens_reasoning, render, split_opened_reasoning
from eagle3.engines.generation.base import Chunk, Skip, TurnRequest, TurnResult, drive_batched
from eagle3.formats.provenance import Provenance
from eagle3.params.generate import GenerateParams


class TransformersBackend:
    def __init__(self, config: GenerateParams, model_dir: Path, provenance: Provenance, dtype: str):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.config = config
        trust = provenance.trust_remote_code
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left", trust_remote_code=trust)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=getattr(torch, dtype), trust_remote_code=trust
        ).eval()
        self.max_len = provenance.max_position_embeddings
        # generate() stops at any of the generation config's EOS ids: the end-of-turn token (Kimi's <|im_end|>) as
        # well as the tokenizer's EOS.
        configured = self.model.generation_config.eos_token_id
        configured = configured if isinstance(configured, list) else [configured]
        self.stop_ids = {token for token in (*configured, self.tokenizer.eos_token_id) if token is not None}

    def process(self, chunks: Iterable[Chunk], on_done: Callable[[Chunk], None]) -> None:
        drive_batched(chunks, self.generate, on_done)

    def environment(self) -> dict[str, Any]:
        return {"backend": "transformers"}

    def close(self) -> None:
        del self.model

    def generate(self, requests: list[TurnRequest]) -> list[TurnResult | Skip]:
        sampling, batch = self.config.sampling, self.config.transformers.batch_size
        results: list[TurnResult | Skip] = []
        for start in range(0, len(requests), batch):
            group = requests[start : start + batch]
            prompts = [render(self.tokenizer, r.messages, True, self.config.chat_template_kwargs) for r in group]
            encoded = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
            lengths = encoded["attention_mask"].sum(dim=1).tolist()
            if max(lengths) >= self.max_len:
                results += [
                    Skip("prompt_too_long") if n >= self.max_len else self.generate([r])[0]
                    for n, r in zip(lengths, group, strict=True)
                ]
                continue
            self.torch.manual_seed(group[0].seed)
            with self.torch.no_grad():
                output = self.model.generate(
                    **encoded,
                    max_new_tokens=sampling.max_tokens,
                    do_sample=sampling.temperature > 0,
                    temperature=sampling.temperature if sampling.temperature > 0 else None,
                    top_p=sampling.top_p if sampling.temperature > 0 else None,
                    pad_token_id=self.tokenizer.pad_token_id,
                )
            width = encoded["input_ids"].shape[1]
            for row, prompt_tokens, prompt in zip(output, lengths, prompts, strict=True):
                new = row[width:].tolist()
                stop = next((i for i, token in enumerate(new) if token in self.stop_ids), None)
                stopped = stop is not None
                new = new[:stop] if stopped else new
                content, reasoning = decode(self.tokenizer, new), None
                if opens_reasoning(prompt):
                    content, reasoning = split_opened_reasoning(self.tokenizer, new, content)
                results.append(
                    TurnResult(
                        content=content,
                        reasoning=reasoning,
                        finish_reason="stop" if stopped else "length",
                        prompt_tokens=prompt_tokens,
                        completion_tokens=len(new) + (1 if stopped else 0),
                    )
                )
        return results
