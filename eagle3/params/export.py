"""params.yaml `export:` — how the trained draft is published for vLLM."""

from typing import Literal

from pydantic import PositiveInt

from eagle3.params.base import Section


class ExportParams(Section):
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    # Written into the speculators-format config (speculators_config.proposal_methods).
    num_speculative_tokens: PositiveInt = 3
