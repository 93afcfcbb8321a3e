"""What every params section shares: unknown keys are errors, values are immutable once loaded, and settings that
only say how to run (not what to make) are marked so resumable stages keep their work when they change."""

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, HttpUrl

_EXECUTION_ONLY = "execution_only"


class Section(BaseModel):
    # No inf or NaN in any float: nothing downstream can use one, and `eagle3 check` would print non-JSON Infinity.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]

# Seeds reach numpy and vLLM, which take unsigned 32-bit ones, and torch.manual_seed.
Seed = Annotated[int, Field(ge=0, lt=2**32)]


def _names_a_variable(name: str) -> str:
    # The message never repeats the value: a key pasted here would otherwise be printed.
    if not re.fullmatch(r"[A-Z_][A-Z0-9_]{0,63}", name):
        raise ValueError(
            "must be the name of an environment variable that holds the key (capitals, digits and _, e.g. "
            "VLLM_API_KEY), never the key itself; the value given is not shown"
        )
    return name


def _without_credentials(url: HttpUrl) -> HttpUrl:
    if url.username or url.password:
        raise ValueError(
            "must not carry credentials (user:password@host): give the key through api_key_env, which names the "
            "environment variable that holds it"
        )
    if url.query or url.fragment:
        raise ValueError(
            "must not carry a query or fragment (an OpenAI base URL has none, and a key there would be printed): give "
            "the key through api_key_env, which names the environment variable that holds it; the value given is not "
            "shown"
        )
    return url


# An api_key_env: the environment variable's name; the key never goes in params.yaml.
EnvironmentVariable = Annotated[str, AfterValidator(_names_a_variable)]
# A server's OpenAI base URL.
ServerUrl = Annotated[HttpUrl, AfterValidator(_without_credentials)]
# Threads or processes one machine starts: far above any machine's need, far below what exhausts it.
Threads = Annotated[int, Field(ge=1, le=4096)]
Workers = Annotated[int, Field(ge=0, le=4096)]


class StageParams(BaseModel):
    """The sections of params.yaml one stage reads, one field per section; the others are ignored here (the
    runner has already validated the whole file) and are not part of what the stage can see."""

    model_config = ConfigDict(extra="ignore", frozen=True)


def execution_only(default: Any, **field: Any) -> Any:
    """A field that changes how a stage runs but not what it makes (processes, memory, retries, URLs): it is left
    out of the stage's run key (`pinned_settings`), so changing it resumes finished work instead of discarding it."""
    return Field(default, json_schema_extra={_EXECUTION_ONLY: True}, **field)


def pin_environment_setting() -> Any:
    """The `pin_environment` setting of the resumable stages (generate, extract, train): also put the execution
    environment (package versions, accelerator, CPU, parallelism: eagle3/environment.py) into the run key, so
    finished work made elsewhere is redone rather than mixed. Off: the environment is recorded only. Left out of
    the key as a setting: its effect enters the key as the environment itself."""
    return execution_only(False)


def pinned_settings(section: BaseModel) -> dict[str, Any]:
    """The section as JSON without its execution-only fields, at any depth: what a run key pins."""
    dumped = section.model_dump(mode="json")
    for name, field in type(section).model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        value = getattr(section, name)
        if extra.get(_EXECUTION_ONLY):
            del dumped[name]
        elif isinstance(value, BaseModel):
            dumped[name] = pinned_settings(value)
    return dumped
