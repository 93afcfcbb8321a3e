"""params.yaml `prepare:` — which open prompt datasets feed the pipeline, and how they are cut and split."""

from typing import Annotated, Literal

from pydantic import Field, PositiveInt, model_validator

from eagle3.params.base import Section, Seed


class LocalDataset(Section):
    """A parquet or JSON-lines file in the open-perfectblend (ShareGPT) or OpenAI `messages` schema."""

    kind: Literal["local"]
    name: str = Field(min_length=1)
    path: str = Field(pattern=r"\.(parquet|jsonl)$", description="relative to params.yaml")
    license: str = Field(min_length=1)
    max_rows: PositiveInt | None = None
    # Rows whose `source` field names one of these are left out (e.g. a sub-source whose license forbids
    # publishing a model trained on it); each must occur in the data.
    exclude_sub_sources: list[str] = []


class HubDataset(Section):
    """A Hugging Face dataset read through `datasets.load_dataset` at a pinned commit."""

    kind: Literal["hf"]
    name: str = Field(min_length=1)
    dataset: str = Field(pattern=r"^[\w.-]+/[\w.-]+$", description="hub id, e.g. mlabonne/open-perfectblend")
    # A branch name moves under you; only a commit hash reproduces.
    revision: str = Field(pattern=r"^[0-9a-f]{40}$")
    config: str | None = None
    split: str = "train"
    license: str = Field(min_length=1)
    max_rows: PositiveInt | None = None
    exclude_sub_sources: list[str] = []


class PrepareParams(Section):
    sources: list[Annotated[LocalDataset | HubDataset, Field(discriminator="kind")]] = Field(min_length=1)
    # Caps apply after validation and dedupe, to a seeded shuffle, so they never favour the file's head.
    max_rows: PositiveInt | None = None
    max_rows_per_source: PositiveInt | None = Field(
        None, description="cap per sub-source (the rows' own `source` field, else the input's name)"
    )
    heldout_rows: int = Field(ge=1)
    seed: Seed = 0

    @model_validator(mode="after")
    def _unique_names(self) -> "PrepareParams":
        names = [source.name for source in self.sources]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"sources: names must be unique, repeated: {', '.join(duplicates)}")
        return self
