"""The hero run's rehearsal configuration: the params.yaml `eagle3 init kimi-k2.5` writes (from
eagle3/configs/kimi-k2.5.yaml, in one of `eagle3 plan`'s layouts) with the overrides of tests/kimi/rehearsal.yaml,
for the Kimi-shaped miniature.

`python tests/rehearsal.py overrides PARAMS` applies them to the params file the runbook's `eagle3 init` just wrote
(docs/hero-run.md's rehearsal table runs it right after init): streamed states (layout C) train in two processes,
as the ranks of 8 GPUs would, and without phases (on a CPU the verifier never sleeps)."""

import sys
from pathlib import Path
from typing import Any

import yaml

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


def rehearsed(params: dict) -> dict:
    """`params` (as init wrote them) as the rehearsal runs them."""
    merged = merge(params, overrides())
    if merged["train"].get("hidden_states") == "streamed":
        merged["train"]["launch"] = {**merged["train"].get("launch", {}), "processes_per_node": 2}
        merged["train"]["stream_phase_steps"] = None
    return merged


def rehearsal_params(layout: str = "B") -> dict:
    from eagle3.init.shipped import render

    return rehearsed(yaml.safe_load(render("kimi-k2.5", layout, "b200", "your-org/Kimi-K2.5-eagle3")))


if __name__ == "__main__" and sys.argv[1:2] == ["overrides"]:
    path = Path(sys.argv[2])
    path.write_text(yaml.safe_dump(rehearsed(yaml.safe_load(path.read_text())), sort_keys=False))
