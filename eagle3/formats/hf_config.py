"""A Hugging Face model directory's config.json, as the pipeline reads it.

Multimodal wrappers (Kimi-K2.5, and every `*ForConditionalGeneration` model) keep the language model's sizes
in a nested `text_config`; `text_config()` is the one place that unwraps it, so every stage sizes the draft
from the same dictionary.
"""

import json
from pathlib import Path
from typing import Any

from eagle3.errors import Eagle3Error

CONFIG = "config.json"


def read_config(
    model_dir: Path, missing_hint: str = "verifier.source.path must be a Hugging Face model directory"
) -> dict[str, Any]:
    path = model_dir / CONFIG
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise Eagle3Error(f"{path}: not found; {missing_hint}") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise Eagle3Error(f"{path}: cannot read the model config ({exc})") from None
    if not isinstance(config, dict):
        raise Eagle3Error(f"{path}: expected a JSON object, got {type(config).__name__}")
    return config


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's config: `text_config` where the model nests one, else the config itself."""
    nested = config.get("text_config")
    return nested if isinstance(nested, dict) and nested else config


def uses_mla(text: dict[str, Any]) -> bool:
    """Multi-head latent attention (DeepSeek-V3, Kimi-K2.5): its head counts and rope describe MLA, not a Llama
    layer, and vLLM runs it on backends of its own."""
    return bool(text.get("kv_lora_rank"))
