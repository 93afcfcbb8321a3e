"""metrics/eval.json: what the evaluate stage measured, the project's main result.

The evaluate stage writes it through `EvalMetrics` and every reader (the lineage report, the model card) reads it
back through `read_eval_metrics`, so a file another version wrote, or one edited by hand, fails in one line naming
the key rather than somewhere inside the card. Figures are rounded to 4 digits where they are ratios.

Tokens per verifier step = output tokens / (output tokens - accepted tokens): a step on which a method proposed
nothing counts as one token, so methods compare fairly; vLLM's mean acceptance length averages over drafting
steps only and counts the verifier's bonus token, as published drafts quote it.
"""

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, ValidationError

from eagle3.errors import Eagle3Error
from eagle3.files import read_report_json
from eagle3.params.evaluate import Method
from eagle3.params.train import DRAFT_METHODS, DraftMethod
from eagle3.paths import EVAL_METRICS

# 95% interval, [low, high].
Interval = Annotated[list[float], Field(min_length=2, max_length=2)]

# Context-length buckets, for the offline estimate's drafts and vLLM's turns alike: [0, 256), then [256, 512),
# [512, 1024), ... doubling.
FIRST_CONTEXT_BUCKET = 256


def context_bucket(tokens: int) -> int:
    """The lower bound of the bucket holding a context of `tokens` tokens."""
    return 0 if tokens < FIRST_CONTEXT_BUCKET else 1 << (tokens.bit_length() - 1)


def context_bucket_end(low: int) -> int:
    """The (exclusive) upper bound of the bucket starting at `low`."""
    return 2 * low if low else FIRST_CONTEXT_BUCKET


class _Record(BaseModel):
    # Strict: a figure written as a string ("1.27") is an error, not a number.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Figures(_Record):
    """One configuration's figures over one prompt set, in one sampling run."""

    method: Method
    # Draft tokens per step (a chain draft's k forwards, a block draft's one); null for the run without speculation.
    k: int | None
    temperature: float
    prompts: NonNegativeInt
    # Turns answered: a multi-turn prompt counts each of its turns.
    completions: NonNegativeInt
    output_tokens: NonNegativeInt
    accepted_tokens: NonNegativeInt
    verifier_steps: NonNegativeInt
    num_drafts: NonNegativeInt
    num_draft_tokens: NonNegativeInt
    tokens_per_step: float
    # Seeded bootstrap over the set's prompts; null where too few prompts or nothing drafted.
    tokens_per_step_ci95: Interval | None
    mean_acceptance_length: float | None
    mean_acceptance_length_ci95: Interval | None
    # Share of drafting steps whose i-th drafted token was accepted, i = 0 .. k-1.
    acceptance_by_position: list[float]
    # Completions identical to the run without speculation (same prompts, greedy); null where not compared.
    lossless_identical: NonNegativeInt | None


class ContextFigures(_Record):
    """One configuration's turns, over every prompt set of its run, whose prompt (the context before the answer's
    first token, as the verifier's tokenizer counts it) has from_tokens <= tokens < to_tokens. The 95% intervals
    resample the conversations that have turns in the bucket."""

    from_tokens: NonNegativeInt
    to_tokens: NonNegativeInt
    prompts: NonNegativeInt
    completions: NonNegativeInt
    output_tokens: NonNegativeInt
    tokens_per_step: float
    tokens_per_step_ci95: Interval | None
    mean_acceptance_length: float | None
    mean_acceptance_length_ci95: Interval | None
    acceptance_by_position: list[float]


class Run(Figures):
    """A held-out `runs` entry: its figures, and the configuration's whole run over every set (they share
    batches)."""

    all_sets_output_tokens: NonNegativeInt
    # Where long context changes acceptance: every set's turns (the long-context probe's included) by prompt length.
    all_sets_by_context: list[ContextFigures]
    output_tokens_per_s: float | None
    seconds: float


class BenchmarkHeadline(_Record):
    tokens_per_step: float | None
    mean_acceptance_length: float | None
    mean_acceptance_length_ci95: Interval | None
    ngram_tokens_per_step: float | None


class Headline(_Record):
    """What the README and the model card quote: the held-out set at the headline k, greedy."""

    k: int
    tokens_per_step_greedy: float
    # null: vLLM's n-gram baseline was not measured.
    ngram_tokens_per_step_greedy: float | None
    # "identical/prompts"; null without a run without speculation to compare with.
    lossless_greedy: str | None
    benchmarks: dict[str, BenchmarkHeadline]


class Lossless(_Record):
    identical: NonNegativeInt | None
    prompts: NonNegativeInt
    rate: float | None
    # Exact only in float32 in-process: in bf16 (and on servers, which batch and usually run bf16), verifying k+1
    # tokens at once rounds differently from decoding one, so near-tied tokens flip and the rate is a measured
    # agreement.
    exact_expected: bool
    dtype: str


class ContextBucket(_Record):
    """Drafts whose context (the tokens before the first drafted one) is in [from_tokens, to_tokens)."""

    from_tokens: NonNegativeInt
    to_tokens: NonNegativeInt
    drafts: NonNegativeInt
    mean_acceptance_length: float


class OfflineEstimate(_Record):
    """Expected tokens per verifier step from held-out hidden states and the exported draft
    (eagle3/engines/offline_estimate.py), beside vLLM's measured figure."""

    k: int
    heldout_tokens_read: NonNegativeInt
    device: str
    positions: NonNegativeInt
    drafts: NonNegativeInt
    tokens_per_step: float
    mean_acceptance_length: float
    acceptance_by_position: list[float]
    top1_agreement_by_position: list[float]
    acceptance_by_context: list[ContextBucket]
    vllm_tokens_per_step: float
    gap: float


class Benchmark(_Record):
    """One benchmark prompt set (eagle3/formats/benchmarks.py): its facts, its figures and its categories'."""

    license: str
    # Records read from the source, prompts evaluated, dropped as training prompts, dropped over the cap.
    records: NonNegativeInt
    prompts: NonNegativeInt
    contaminated: NonNegativeInt
    capped: NonNegativeInt
    results: list[Figures]
    categories: dict[str, list[Figures]]


class Probe(_Record):
    # The prompt's tokens, as the verifier's tokenizer counts the chat template's rendering.
    prompt_tokens: NonNegativeInt
    # The held-out conversations chained into its history, then the one whose first user turn it asks, in order.
    prompt_hashes: list[str]


class LongContext(_Record):
    """The long-context probe (eagle3/chat/long_context.py): held-out conversations chained, with the verifier's
    own answers, into one history of up to `context_tokens` tokens, then a held-out question asked after it."""

    context_tokens: NonNegativeInt
    probes: list[Probe]
    results: list[Figures]


class Prompts(_Record):
    split: Literal["heldout"]
    count: NonNegativeInt
    prompt_hashes: list[str]


class EvalMetrics(_Record):
    headline: Headline
    lossless: Lossless
    offline_estimate: OfflineEstimate
    # An MLA verifier's attention in vLLM (mla_in_vllm, eagle3/engines/measurers.py); null: not an MLA verifier,
    # or on servers.
    mla: dict[str, Any] | None
    runs: list[Run] = Field(min_length=1)
    benchmarks: dict[str, Benchmark]
    # null: evaluate.long_context is off.
    long_context: LongContext | None
    # What the later turns of multi-turn sets followed: the verifier's own greedy answers (the none run), or,
    # without a none run, each configuration's own greedy answers.
    later_turns_follow: Literal["none", "each configuration's own"]
    prompts: Prompts
    # What every prompt passed to the verifier's chat template: generate's, so that a template switch (thinking
    # on or off) is measured as the draft was trained.
    chat_template_kwargs: dict[str, Any]
    max_tokens: int
    # True where this vLLM build needed eagle3/engines/speculative.py's fix for sampled (temperature > 0) runs.
    repaired_vllm_temperature_expansion: bool
    # What computed the figures (eagle3/environment.py; for servers, what each reported).
    environment: dict[str, Any]
    seconds: float

    def greedy_run(self, method: str, k: int | None) -> Run | None:
        return next((r for r in self.runs if r.method == method and r.k == k and r.temperature == 0), None)

    @property
    def draft_method(self) -> DraftMethod:
        """The evaluated draft's method: that of the runs that drafted with it (read_eval_metrics requires one)."""
        found = {run.method for run in self.runs if run.method in DRAFT_METHODS}
        if len(found) != 1:
            raise Eagle3Error(
                f"{EVAL_METRICS.as_posix()}: runs: one draft method expected ({', '.join(DRAFT_METHODS)}), got "
                f"{sorted(found)}; rerun the evaluate stage"
            )
        return found.pop()  # type: ignore[return-value]

    def headline_run(self) -> Run:
        """The draft's greedy run at the headline k, which read_eval_metrics requires."""
        run = self.greedy_run(self.draft_method, self.headline.k)
        if run is None:
            raise Eagle3Error(
                f"{EVAL_METRICS.as_posix()}: runs: no greedy {self.draft_method} run at k={self.headline.k}; rerun "
                "the evaluate stage"
            )
        return run

    def as_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def read_eval_metrics(root: Path) -> EvalMetrics:
    """metrics/eval.json of the project at `root`; one error line naming the first wrong key."""
    where, rerun = EVAL_METRICS.as_posix(), "rerun the evaluate stage"
    try:
        data = read_report_json(root / EVAL_METRICS, "evaluation metrics", rerun)
    except FileNotFoundError:
        raise Eagle3Error(
            f"{where}: missing; a draft is not published without evaluation metrics: run the evaluate stage "
            "(`dvc repro`) first"
        ) from None
    try:
        metrics = EvalMetrics.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        key = ".".join(str(part) for part in error["loc"]) or "(top level)"
        raise Eagle3Error(f"{where}: {key}: {error['msg']}; {rerun}") from None
    metrics.headline_run()
    return metrics
