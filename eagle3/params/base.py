"""What every params section shares: unknown keys are errors, values are immutable once loaded."""

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
