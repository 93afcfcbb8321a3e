"""params.yaml `generate:` — how the verifier regenerates the assistant turns."""

from typing import Any, Literal

from pydantic import Field, NonNegativeInt, PositiveInt, field_validator, model_validator

from eagle3.params.base import (
    EnvironmentVariable,
    Section,
    Seed,
    ServerUrl,
    Threads,
    execution_only,
    pin_environment_setting,
)
from eagle3.precision import EngineDtype

_OWNED_BODY_FIELDS = {
    "model",
    "messages",
    "temperature",
    "top_p",
    "max_tokens",
    "seed",
    "chat_template_kwargs",
    "stream",
    "n",
}


class Sampling(Section):
    temperature: float = Field(0.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: PositiveInt = 256
    # Each request's seed derives from this, the sample id and the turn, so sampled output does not depend on batching.
    seed: Seed = 0


class VllmEngine(Section):
    """Offline `vllm.LLM` engine arguments."""

    tensor_parallel_size: PositiveInt = execution_only(1)
    max_model_len: PositiveInt = 2048
    gpu_memory_utilization: float = execution_only(0.9, gt=0, le=1)
    # vLLM's CPU build sizes its KV cache from VLLM_CPU_KVCACHE_SPACE (GiB), not from memory utilization.
    cpu_kvcache_space_gib: PositiveInt = execution_only(2)
    # Skips torch.compile, which on CPU costs minutes of engine start for little gain.
    enforce_eager: bool = False


class OpenAIServers(Section):
    """OpenAI-compatible servers (`vllm serve` of the verifier); requests are spread over all of them."""

    base_urls: list[ServerUrl] = execution_only(..., min_length=1, description="e.g. http://10.0.0.5:8000/v1")
    model: str = Field(min_length=1, description="the served model name")
    concurrency: Threads = execution_only(32)
    # Deadline of one request, for its whole answer: a 16-32K-token reasoning answer takes many minutes. A request
    # past it is retried (regenerating that turn) and counts toward max_retries.
    timeout_s: float = execution_only(3600.0, gt=0)
    max_retries: NonNegativeInt = execution_only(8)
    backoff_s: float = execution_only(1.0, gt=0)
    max_backoff_s: float = execution_only(30.0, gt=0)
    # Name of an environment variable holding the API key; the key itself never goes in params.yaml.
    api_key_env: EnvironmentVariable | None = execution_only(None)
    # Extra fields for every request body, passed through as given (e.g. top_k, repetition_penalty,
    # skip_special_tokens); they shape the answers, so they are part of the run key.
    extra_body: dict[str, Any] = {}
    # Before the first part, one probe request per server checks that a reasoning model's thinking comes back
    # (a server started without `--reasoning-parser` can lose it). auto: when the verifier's chat template renders
    # reasoning; require: always; off: never (e.g. thinking switched off through chat_template_kwargs).
    reasoning_check: Literal["auto", "require", "off"] = execution_only("auto")

    @field_validator("extra_body")
    @classmethod
    def _no_owned_fields(cls, body: dict[str, Any]) -> dict[str, Any]:
        owned = sorted(set(body) & _OWNED_BODY_FIELDS)
        if owned:
            raise ValueError(
                f"{owned} are set by the stage (sampling, model, messages, chat_template_kwargs have their own params)"
            )
        return body


class TransformersFallback(Section):
    batch_size: PositiveInt = execution_only(8)


class GenerateParams(Section):
    backend: Literal["vllm", "openai", "transformers"] = "vllm"
    # What the verifier computes in (backends vllm and transformers; the servers decide for openai). auto:
    # bfloat16 where the device computes it natively, else float32 (eagle3/precision.py). The weights are stored
    # as verifier.dtype whatever this says; the resolved value is part of the run key.
    dtype: EngineDtype = "auto"
    # all: every assistant turn, each conditioned on the regenerated history;
    # last: only the reply to the last user turn.
    turns: Literal["all", "last"] = "all"
    # Passed to the chat template wherever it renders (every backend, extract's token layout through the records, and
    # evaluate's prompts), e.g. {thinking: false} for a model whose template switches thinking.
    chat_template_kwargs: dict[str, Any] = {}
    splits: list[Literal["train", "heldout"]] = Field(["train", "heldout"], min_length=1)
    # Samples per output part: the unit of resume (a killed run redoes at most the parts in flight).
    chunk_size: PositiveInt = 64
    sampling: Sampling = Sampling()
    vllm: VllmEngine = VllmEngine()
    openai: OpenAIServers | None = None
    transformers: TransformersFallback = TransformersFallback()
    pin_environment: bool = pin_environment_setting()

    @model_validator(mode="after")
    def _openai_needs_servers(self) -> "GenerateParams":
        if self.backend == "openai" and self.openai is None:
            raise ValueError("backend openai needs an `openai:` block with base_urls and model")
        return self
