"""params.yaml `evaluate:` — how the draft is measured inside vLLM."""

from typing import Literal

from pydantic import Field, PositiveInt, field_validator, model_validator

from eagle3.params.base import Section


class NgramBaseline(Section):
    # vLLM's prompt-lookup proposer; null keeps vLLM's own defaults (currently 5 and 5).
    prompt_lookup_min: PositiveInt | None = None
    prompt_lookup_max: PositiveInt | None = None


class EvalEngine(Section):
    # The verifier's dtype in these runs ("auto": the checkpoint's). In bf16, verifying k+1 tokens at once rounds
    # differently from decoding one, so near-tied greedy choices can flip (6 of 16 short completions differed on
    # CPU): float32 keeps the lossless check about speculation, not rounding. On GPUs at scale: auto.
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    max_model_len: PositiveInt = 2048
    tensor_parallel_size: PositiveInt = 1
    gpu_memory_utilization: float = Field(0.3, gt=0, le=1)
    cpu_kvcache_space_gib: PositiveInt = 2
    enforce_eager: bool = True


class EvaluateParams(Section):
    # Draft lengths to measure (vLLM num_speculative_tokens).
    num_speculative_tokens: list[PositiveInt] = Field([1, 3, 5], min_length=1)
    # The k whose greedy figures are the headline (metrics, model card) and at which the offline estimate runs.
    headline_k: PositiveInt = 3
    # Every run is greedy and at this temperature.
    temperature: float = Field(0.7, gt=0)
    max_tokens: PositiveInt = 256
    # Held-out prompts used (their first user turn); null: all of them.
    max_prompts: PositiveInt | None = None
    seed: int = 0
    ngram: NgramBaseline = NgramBaseline()
    vllm: EvalEngine = EvalEngine()

    @field_validator("num_speculative_tokens")
    @classmethod
    def _distinct(cls, ks: list[int]) -> list[int]:
        if len(set(ks)) != len(ks):
            raise ValueError(f"must be distinct, got {ks}")
        return sorted(ks)

    @model_validator(mode="after")
    def _headline_measured(self) -> "EvaluateParams":
        if self.headline_k not in self.num_speculative_tokens:
            raise ValueError(
                f"headline_k {self.headline_k} must be one of num_speculative_tokens {self.num_speculative_tokens}"
            )
        return self
