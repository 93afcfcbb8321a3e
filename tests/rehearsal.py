"""The hero run's rehearsal configuration: the shipped hero configuration (eagle3/configs/kimi-k2.5.yaml, in one of
`eagle3 plan`'s layouts) with the overrides of tests/kimi/rehearsal.yaml, for the Kimi-shaped miniature."""

from pathlib import Path
from typing import Any

import yaml

from eagle3.tools.configs import render

OVERRIDES = Path(__file__).resolve().parent / "kimi" / "rehearsal.yaml"


def overrides() -> dict:
    return yaml.safe_load(OVERRIDES.read_text())


def merge(base: Any, override: Any, where: str = "") -> Any:
    """`override` over `base`: mappings key by key, anything else whole. An override equal to what it replaces is
    refused: it would hide a change of the hero configuration."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for key, value in override.items():
            merged[key] = merge(base.get(key), value, f"{where}.{key}" if where else key) if key in base else value
        return merged
    if override == base:
        raise ValueError(f"{OVERRIDES.name}: {where} restates the hero configuration's value {base!r}")
    return override


def rehearsal_params(layout: str = "B") -> dict:
    return merge(yaml.safe_load(render("kimi-k2.5", layout)), overrides())
