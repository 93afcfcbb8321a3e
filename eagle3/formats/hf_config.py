"""A Hugging Face model directory's JSON files, as the pipeline reads them: config.json and the weights' index.

Multimodal wrappers (Kimi-K2.5, and every `*ForConditionalGeneration` model) keep the language model's sizes
in a nested `text_config`; `text_config()` is the one place that unwraps it, so every stage sizes the draft
from the same dictionary.

Model directories come from a hub, a DVC remote or someone else's disk, so their files are read as untrusted: one
that is unreadable, not UTF-8, not JSON or not a JSON object, or a field the pipeline reads that has the wrong type
or an impossible value, is one Eagle3Error naming the file and the field. Types are strict ("8192" is not 8192,
true is not 1); keys the pipeline never reads are the model's own business. Which keys must be present is the
reader's to say (`require`): validate-draft, the verifier stage and a draft's loader need different ones.
"""

import json
from pathlib import Path
from typing import Annotated, Any

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError, with_config
from typing_extensions import TypedDict

from eagle3.errors import Eagle3Error, field_problem

CONFIG = "config.json"
WEIGHT_INDEX = "model.safetensors.index.json"
# Far above any real config, weight index or tokenizer config (a 600 GB checkpoint's index is a few MB), so that
# a hostile file is refused before json holds all of it in memory.
MAX_JSON_BYTES = 64 << 20
FIELDS = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)
# A size or count: positive and within int32, as every index the engines take.
Size = Annotated[int, Field(ge=1, lt=2**31)]
Positive = Annotated[float, Field(gt=0)]
Eps = Annotated[float, Field(gt=0, lt=1)]
# Short: names are echoed in one-line errors.
Name = Annotated[str, Field(max_length=256)]
# A weights file beside the index: a plain file name, no directory and no leading dot (`..`, hidden files).
WeightFile = Annotated[str, Field(pattern=r"^[^./\\\x00-\x1f][^/\\\x00-\x1f]{0,250}\.safetensors$")]


@with_config(FIELDS)
class _Rope(TypedDict, total=False):
    rope_type: Name | None
    type: Name | None
    rope_theta: Positive | None
    factor: Positive | None
    original_max_position_embeddings: Size | None


@with_config(FIELDS)
class LanguageModel(TypedDict, total=False):
    """The keys of a (text) config that the pipeline reads."""

    architectures: Annotated[list[Name], Field(max_length=16)] | None
    model_type: Name | None
    hidden_size: Size | None
    num_hidden_layers: Size | None
    num_attention_heads: Size | None
    num_key_value_heads: Size | None
    head_dim: Size | None
    intermediate_size: Size | None
    vocab_size: Size | None
    max_position_embeddings: Size | None
    rms_norm_eps: Eps | None
    hidden_act: Name | None
    rope_theta: Positive | None
    rope_scaling: _Rope | None
    rope_parameters: _Rope | None
    kv_lora_rank: Annotated[int, Field(ge=0, lt=2**31)] | None
    tie_word_embeddings: bool | None
    auto_map: dict[str, Any] | None


@with_config(FIELDS)
class _ModelConfig(LanguageModel, total=False):
    text_config: LanguageModel | None


@with_config(ConfigDict(strict=True, extra="allow"))
class _WeightIndex(TypedDict):
    weight_map: Annotated[dict[Annotated[str, Field(min_length=1)], WeightFile], Field(min_length=1)]


_MODEL_CONFIG, _WEIGHT_INDEX = TypeAdapter(_ModelConfig), TypeAdapter(_WeightIndex)


def _suffix(fix: str | None) -> str:
    return f"; {fix}" if fix else ""


def read_json(path: Path, missing_hint: str, fix: str | None = None) -> dict[str, Any]:
    """The JSON object in `path`, read as untrusted (the module doc)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_JSON_BYTES + 1)
    except FileNotFoundError:
        raise Eagle3Error(f"{path}: not found; {missing_hint}") from None
    except OSError as exc:
        raise Eagle3Error(f"{path}: cannot read it ({exc.strerror or exc}){_suffix(fix)}") from None
    if len(data) > MAX_JSON_BYTES:
        raise Eagle3Error(f"{path}: over {MAX_JSON_BYTES} bytes, too large for a model's JSON file{_suffix(fix)}")
    try:
        parsed = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise Eagle3Error(f"{path}: not UTF-8 text ({exc}){_suffix(fix)}") from None
    except (ValueError, RecursionError) as exc:
        raise Eagle3Error(f"{path}: not JSON ({exc}){_suffix(fix)}") from None
    if not isinstance(parsed, dict):
        raise Eagle3Error(f"{path}: a JSON {type(parsed).__name__}, not an object{_suffix(fix)}")
    return parsed


def check_fields(path: Path, data: dict[str, Any], schema: TypeAdapter, fix: str | None = None) -> None:
    """`data` (read from `path`) as `schema` types it, or one line naming the first field that is not."""
    try:
        schema.validate_python(data)
    except ValidationError as exc:
        raise Eagle3Error(f"{path}: {field_problem(exc)}{_suffix(fix)}") from None


def read_config(
    model_dir: Path,
    missing_hint: str = "verifier.source.path must be a Hugging Face model directory",
    fix: str | None = None,
) -> dict[str, Any]:
    """config.json as written (ints stay ints), the fields the pipeline reads checked."""
    path = model_dir / CONFIG
    config = read_json(path, missing_hint, fix)
    check_fields(path, config, _MODEL_CONFIG, fix)
    return config


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's config: `text_config` where the model nests one, else the config itself."""
    nested = config.get("text_config")
    return nested if isinstance(nested, dict) and nested else config


def require(path: Path, config: dict[str, Any], keys: tuple[str, ...], why: str) -> dict[str, Any]:
    """The language model's config (`text_config`) read from `path`, each of `keys` set in it (not null)."""
    text = text_config(config)
    for key in keys:
        if text.get(key) is None:
            where = "text_config." if text is not config else ""
            raise Eagle3Error(f"{path}: missing `{where}{key}`; {why}")
    return text


def weight_index(model_dir: Path, fix: str) -> dict[str, str]:
    """model.safetensors.index.json's weight_map: tensor name -> the file beside it that holds the tensor."""
    path = model_dir / WEIGHT_INDEX
    index = read_json(path, "safetensors weights needed", fix)
    check_fields(path, index, _WEIGHT_INDEX, fix)
    return index["weight_map"]


def stored_dtype(config: dict[str, Any]) -> str | None:
    """The dtype a checkpoint's config says its weights are stored in (`dtype` since transformers 4.56,
    `torch_dtype` before); None where it says neither."""
    value = config.get("dtype") or config.get("torch_dtype")
    return str(value) if value else None


def uses_mla(text: dict[str, Any]) -> bool:
    """Multi-head latent attention (DeepSeek-V3, Kimi-K2.5): its head counts and rope describe MLA, not a Llama
    layer, and vLLM runs it on backends of its own."""
    return bool(text.get("kv_lora_rank"))
