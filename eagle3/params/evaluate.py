"""params.yaml `evaluate:` — how the draft is measured inside vLLM."""

from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveInt, field_validator, model_validator

from eagle3.params.base import EnvironmentVariable, Section, Seed, ServerUrl, Threads, execution_only
from eagle3.params.train import DRAFT_METHODS, DraftMethod
from eagle3.precision import EngineDtype

# none: the verifier alone; a draft method (the trained draft, as vLLM serves it); ngram: vLLM's prompt lookup.
Method = Literal["none", "eagle3", "dflash", "ngram"]
# Where each method's runs sort: the reference first, the draft, the baseline.
_ORDER: dict[str, int] = {"none": 0, **dict.fromkeys(DRAFT_METHODS, 1), "ngram": 2}


class NgramBaseline(Section):
    # vLLM's prompt-lookup proposer; null keeps vLLM's own defaults (currently 5 and 5).
    prompt_lookup_min: PositiveInt | None = None
    prompt_lookup_max: PositiveInt | None = None


class EvalEngine(Section):
    # The verifier's dtype in these runs (auto: bfloat16 where the device computes it natively, else float32:
    # eagle3/precision.py). In bf16, verifying k+1 tokens at once rounds differently from decoding one, so
    # near-tied greedy choices can flip (6 of 16 short completions differed on CPU): float32 keeps the lossless
    # check about speculation, not rounding. On GPUs at scale: auto.
    dtype: EngineDtype = "auto"
    max_model_len: PositiveInt = 2048
    tensor_parallel_size: PositiveInt = 1
    gpu_memory_utilization: float = Field(0.3, gt=0, le=1)
    cpu_kvcache_space_gib: PositiveInt = 2
    enforce_eager: bool = True


class Endpoint(Section):
    """A running vLLM server and what it serves (eagle3/engines/served_speculation.py checks the label)."""

    url: ServerUrl = Field(description="its OpenAI base URL, e.g. http://10.0.0.5:8000/v1")
    model: str = Field(min_length=1, description="the served model name")
    serves: Method
    # num_speculative_tokens of its --speculative-config; none for a server without speculation.
    k: PositiveInt | None = None

    @model_validator(mode="after")
    def _k_matches_method(self) -> "Endpoint":
        if (self.serves == "none") != (self.k is None):
            raise ValueError(f"k: give k exactly when the endpoint speculates (serves {self.serves}, k {self.k})")
        return self


class Servers(Section):
    endpoints: list[Endpoint] = Field(min_length=1)
    concurrency: Threads = execution_only(32)
    # A reasoning model's answer can take many minutes at 16K+ tokens.
    timeout_s: float = execution_only(3600.0, gt=0)
    # A request that fails is retried after backoff_s, then twice as long each time: the defaults wait ~2 min in
    # all, what a restarting tunnel or a briefly overloaded server needs; a rerun keeps every finished batch.
    max_retries: NonNegativeInt = execution_only(6)
    backoff_s: float = execution_only(2.0, gt=0)
    # Name of an environment variable holding the API key; the key itself never goes in params.yaml.
    api_key_env: EnvironmentVariable | None = execution_only(None)

    @field_validator("endpoints")
    @classmethod
    def _distinct(cls, endpoints: list[Endpoint]) -> list[Endpoint]:
        labels = [(e.serves, e.k) for e in endpoints]
        repeated = sorted({f"{m}" + (f" k={k}" if k else "") for m, k in labels if labels.count((m, k)) > 1})
        if repeated:
            raise ValueError(f"one endpoint per configuration, repeated: {', '.join(repeated)}")
        return endpoints


class OfflineEstimate(Section):
    # Held-out tokens the estimate reads at most (whole samples, in shard order): bounds its cost at hero scale.
    max_tokens: PositiveInt = 200_000
    # Positions whose verifier logits exist at once: memory is chunk x vocabulary, never tokens x vocabulary.
    chunk_tokens: PositiveInt = execution_only(1024)


class LongContextProbe(Section):
    """Where acceptance at long context is measured: held-out conversations chained, with the verifier's own answers
    (generate's held-out split), into histories of up to context_tokens, each followed by another held-out question
    (eagle3/chat/long_context.py)."""

    conversations: PositiveInt = Field(description="probes asked")
    context_tokens: PositiveInt = Field(description="a probe's prompt tokens at most (the answer adds max_tokens)")


class EvaluateParams(Section):
    # engines: a fresh in-process vLLM engine per configuration (CPU, small models); servers: running vLLM servers.
    backend: Literal["engines", "servers"] = "engines"
    # engines: the methods run, each at every k of num_speculative_tokens ("none" is the lossless reference), one of
    # them the trained draft's (train.draft_method); a block draft (dflash) runs only at the headline k, its block
    # size less one.
    methods: list[Method] = Field(["none", "eagle3", "ngram"], min_length=1)
    # Draft lengths to measure (vLLM num_speculative_tokens).
    num_speculative_tokens: list[PositiveInt] = Field([1, 3, 5], min_length=1)
    # The k whose greedy figures are the headline (metrics, model card) and at which the offline estimate runs.
    headline_k: PositiveInt = 3
    # Every configuration runs greedy; the sampled runs at this temperature.
    temperature: float = Field(0.7, gt=0)
    # Where the sampled runs happen: headline_k (the k sweep is greedy; on CPU the sampled runs at the other ks
    # were ~30% of the stage's time) or every_k. `none` runs sampled either way: the sampled runs' speed baseline.
    sampled_at: Literal["headline_k", "every_k"] = "headline_k"
    max_tokens: PositiveInt = 256
    # Held-out prompts used (their first user turn); null: all of them.
    max_prompts: PositiveInt | None = None
    seed: Seed = 0
    ngram: NgramBaseline = NgramBaseline()
    vllm: EvalEngine = EvalEngine()
    servers: Servers | None = None
    offline: OfflineEstimate = OfflineEstimate()
    # null: no long-context probe; the turns of the other sets are still reported by prompt length.
    long_context: LongContextProbe | None = None

    @field_validator("num_speculative_tokens")
    @classmethod
    def _distinct(cls, ks: list[int]) -> list[int]:
        if len(set(ks)) != len(ks):
            raise ValueError(f"must be distinct, got {ks}")
        return sorted(ks)

    @field_validator("methods")
    @classmethod
    def _methods_distinct(cls, methods: list[str]) -> list[str]:
        if len(set(methods)) != len(methods):
            raise ValueError(f"must be distinct, got {methods}")
        return methods

    @model_validator(mode="after")
    def _headline_measured(self) -> "EvaluateParams":
        if self.backend == "servers":
            if self.servers is None:
                raise ValueError("servers: backend servers needs servers.endpoints")
            served = sorted({e.serves for e in self.servers.endpoints if e.serves in DRAFT_METHODS})
            if len(served) != 1:
                raise ValueError(
                    f"servers.endpoints: exactly one draft method is evaluated (the trained draft's), got {served}"
                )
            # A draft endpoint has a k (Endpoint checks it).
            ks = sorted(e.k for e in self.servers.endpoints if e.serves == served[0] and e.k is not None)
            if self.headline_k not in ks:
                raise ValueError(
                    f"headline_k {self.headline_k} must be the k of an endpoint serving {served[0]}, got {ks}"
                )
            return self
        if sum(m in DRAFT_METHODS for m in self.methods) != 1:
            raise ValueError(
                f"methods: must include exactly one of {', '.join(DRAFT_METHODS)}, the trained draft's method "
                f"(train.draft_method), got {self.methods}"
            )
        if self.headline_k not in self.num_speculative_tokens:
            raise ValueError(
                f"headline_k {self.headline_k} must be one of num_speculative_tokens {self.num_speculative_tokens}"
            )
        return self

    @property
    def draft_method(self) -> DraftMethod:
        """The method of the draft being evaluated (the validators make it exactly one)."""
        if self.backend == "servers":
            assert self.servers is not None
            methods = [e.serves for e in self.servers.endpoints]
        else:
            methods = list(self.methods)
        return next(m for m in methods if m in DRAFT_METHODS)  # type: ignore[return-value]

    def temperatures(self, k: int | None) -> tuple[float, ...]:
        """What configuration (method, k) runs at: greedy first, then `temperature` where `sampled_at` puts it."""
        if self.sampled_at == "every_k" or k is None or k == self.headline_k:
            return (0.0, self.temperature)
        return (0.0,)

    def configurations(self) -> list[tuple[str, int | None]]:
        """(method, k) of every measured configuration, the reference (none) first."""
        if self.backend == "servers":
            assert self.servers is not None
            found = [(e.serves, e.k) for e in self.servers.endpoints]
        else:
            found = [(m, self._k_of(m, k)) for m in self.methods for k in self.num_speculative_tokens]
            found = list(dict.fromkeys(found))
        return sorted(found, key=lambda c: (_ORDER[c[0]], c[1] or 0))

    def _k_of(self, method: str, k: int) -> int | None:
        """The k a method runs at when the sweep asks for k: none drafts nothing; a block draft proposes exactly
        its block less one, the headline k (the params file checks it)."""
        if method == "none":
            return None
        return self.headline_k if method == "dflash" else k
