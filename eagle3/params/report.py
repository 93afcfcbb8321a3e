"""params.yaml `report:` — the publish gate's license policy and the model card's fields."""

from pydantic import Field, field_validator

from eagle3.params.base import Section


class LicenseOverride(Section):
    """Publish despite an input license the gate would stop (see eagle3/publish/licenses.py), for a stated reason."""

    license: str = Field(min_length=1, description="the license id as the input records it, e.g. modified-mit")
    # A sentence, not a checkbox: it is printed in the lineage report and the model card.
    reason: str = Field(min_length=20)

    @field_validator("reason")
    @classmethod
    def _says_something(cls, reason: str) -> str:
        if len(reason.split()) < 4:
            raise ValueError("reason must say in a sentence why publishing is allowed (printed in the report and card)")
        return reason


class ReportParams(Section):
    # The Hub repo the draft is published as; null: the card's serve command points at the local models/draft.
    draft_repo: str | None = Field(None, pattern=r"^[\w.-]+/[\w.-]+$")
    # The draft's own license; null: the verifier's (a draft is derived from the verifier's outputs and states).
    license: str | None = None
    license_overrides: list[LicenseOverride] = []
    # Licenses of a dataset's sub-sources (the rows' `source` field) where known, e.g. {"MetaMath": "mit"}.
    sub_source_licenses: dict[str, str] = {}

    @field_validator("license_overrides")
    @classmethod
    def _one_reason_per_license(cls, overrides: list[LicenseOverride]) -> list[LicenseOverride]:
        ids = [item.license.strip().lower() for item in overrides]
        repeated = sorted({key for key in ids if ids.count(key) > 1})
        if repeated:
            raise ValueError(f"each license may be overridden once, repeated: {', '.join(repeated)}")
        return overrides
