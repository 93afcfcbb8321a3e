"""`eagle3 plan`: disk, time and cost of the hero run before any money is spent.

Not a DVC stage: it reads CLI flags (and `metrics/extract.json` for the measured compression ratio) and prints a
table or JSON (eagle3/tools/plan_cli.py). Every number comes from one of the formulas below; README.md
("Planning the hero run") walks through the seed case.

Units: 1 GB = 1e9 bytes, 1 TB = 1e12 bytes, 1 Gbit/s = 1e9 bit/s (as links and disks are sold).

Sizes
    tokens              = samples * mean_tokens
    bytes_per_token     = captured_layers * hidden_size * bytes_per_element
    raw                 = tokens * bytes_per_token
    stored              = raw / compression_ratio                   (ratio measured by the extract stage)
    largest_sample      = max_tokens * bytes_per_token              (one record, held in memory while written)
    text                = tokens * TEXT_BYTES_PER_TOKEN             (prompts + synthetic answers, before zstd)
    draft_params        = 10 * H^2 + 3 * H * intermediate + draft_vocab * H
                          (fc 3H^2; q, k, v from 2H to H: 6H^2; o_proj H^2; gated MLP; draft lm_head;
                           embeddings are the verifier's and are not stored)
    checkpoints         = draft_params * CHECKPOINT_BYTES_PER_PARAM * keep_checkpoints
    disk(scenario)      = (the items that scenario keeps on the rented machine) * (1 + headroom)

Rates
    link_bytes_per_s    = link_gbit * 1e9 * link_efficiency / 8
    flops_per_token     = 2 * active_params + 2 * num_layers * mean_tokens * hidden_size
                          (forward matmuls; causal attention averages mean_tokens / 2 keys per token, and
                           QK^T plus AV cost 2 * 2 * hidden FLOPs per key per layer)
    target_tokens_per_s = --extract-tokens-per-s, else gpus * gpu_tflops * 1e12 * mfu / flops_per_token
    machine_usd_per_h   = gpus * gpu_usd_per_hour

Scenarios (rented hours are what the bill counts; training itself is the same in A and B and is left out)
    A  extract here, ship the stored shards:   rented = stored / link
                                               cost   = rented * machine_usd_per_h
                                                        + (tokens / here_tokens_per_s) * here_usd_per_hour
    B  ship text, extract on the rented box:   rented = (weights + text) / link + tokens / target_tokens_per_s
    C  online, no hidden states on disk:       rented = (weights + text) / link + epochs * tokens / target_tokens_per_s

Break-even between A and B (both costs are linear in tokens N; B also pays once to fetch the verifier weights):
    cost_A(N) = N * a,  a = stored_per_token / link * P + here_usd_per_token
    cost_B(N) = F + N * b,  F = weights / link * P,  b = (text_per_token / link + 1 / target_tokens_per_s) * P
    N* = F / (a - b) when a > b: A is cheaper below N*, B above. When a <= b, A is cheaper at any size.
"""

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eagle3.errors import Eagle3Error
from eagle3.formats.hf_config import text_config

GB, TB = 1e9, 1e12
# Prompts and answers as UTF-8 text: ~4 characters per token, before zstd.
TEXT_BYTES_PER_TOKEN = 4
# fp32 weights + AdamW's two fp32 moments, the state a resumable checkpoint must hold.
CHECKPOINT_BYTES_PER_PARAM = 12


@dataclass(frozen=True)
class VerifierShape:
    name: str
    hidden_size: int
    num_layers: int
    vocab_size: int
    intermediate_size: int
    total_params: float | None
    active_params: float | None
    weights_bytes: float | None


PRESETS = {
    # Kimi-K2.5 (DeepSeek-V3 architecture): dense MLP width 18432; ~1.03T parameters, 32B active per token; the
    # published checkpoint (int4 routed experts) is ~600 GB.
    "kimi-k2.5": VerifierShape("moonshotai/Kimi-K2.5", 7168, 61, 163840, 18432, 1.03e12, 32e9, 600 * GB),
}


@dataclass
class Inputs:
    verifier: VerifierShape
    samples: int
    mean_tokens: float
    max_tokens: int
    captured_layers: int
    bytes_per_element: int
    compression_ratio: float
    link_gbit: float
    link_efficiency: float
    weights_link_gbit: float
    target_tokens_per_s: float | None
    gpus: int
    gpu_tflops: float
    mfu: float
    gpu_usd_per_hour: float
    here_tokens_per_s: float | None
    here_usd_per_hour: float
    epochs: int
    draft_vocab: int
    keep_checkpoints: int
    headroom: float
    disk_tb: float | None
    sources: dict[str, str] = field(default_factory=dict)


def verifier_shape(spec: str) -> VerifierShape:
    """A preset name, or a Hugging Face config.json (a multimodal one's `text_config` is used). The weights' size
    comes from model.safetensors.index.json beside it, else from the *.safetensors files there."""
    if spec in PRESETS:
        return PRESETS[spec]
    path = Path(spec)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise Eagle3Error(f"unknown verifier {spec!r}: not a preset ({', '.join(PRESETS)}) and no such config.json")
    try:
        config = json.loads(path.read_text())
        text = text_config(config)
        hidden, layers, vocab = int(text["hidden_size"]), int(text["num_hidden_layers"]), int(text["vocab_size"])
        intermediate = int(text.get("intermediate_size") or 4 * hidden)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise Eagle3Error(
            f"{path}: not a usable verifier config.json ({type(exc).__name__}: {exc}); it needs hidden_size, "
            "num_hidden_layers and vocab_size"
        ) from None
    weights = None
    index = path.with_name("model.safetensors.index.json")
    if index.is_file():
        try:
            weights = float(json.loads(index.read_text())["metadata"]["total_size"])
        except (OSError, ValueError, KeyError, TypeError):
            weights = None
    if weights is None:
        weights = float(sum(f.stat().st_size for f in path.parent.glob("*.safetensors"))) or None
    name = config.get("_name_or_path") or str(path.parent)
    return VerifierShape(name, hidden, layers, vocab, intermediate, None, None, weights)


def compute(inputs: Inputs) -> dict[str, Any]:
    """The whole plan as plain numbers (bytes, seconds, dollars). Formulas: the module docstring."""
    v = inputs.verifier
    tokens = inputs.samples * inputs.mean_tokens
    bytes_per_token = inputs.captured_layers * v.hidden_size * inputs.bytes_per_element
    raw = tokens * bytes_per_token
    stored = raw / inputs.compression_ratio
    text = tokens * TEXT_BYTES_PER_TOKEN
    draft_params = 10 * v.hidden_size**2 + 3 * v.hidden_size * v.intermediate_size + inputs.draft_vocab * v.hidden_size
    checkpoints = draft_params * CHECKPOINT_BYTES_PER_PARAM * inputs.keep_checkpoints
    weights = v.weights_bytes

    link = inputs.link_gbit * 1e9 * inputs.link_efficiency / 8
    weights_link = inputs.weights_link_gbit * 1e9 * inputs.link_efficiency / 8
    flops_per_token = 2 * (v.active_params or 0) + 2 * v.num_layers * inputs.mean_tokens * v.hidden_size
    target_tps = inputs.target_tokens_per_s or inputs.gpus * inputs.gpu_tflops * 1e12 * inputs.mfu / flops_per_token
    machine_usd_per_s = inputs.gpus * inputs.gpu_usd_per_hour / 3600
    here_seconds = tokens / inputs.here_tokens_per_s if inputs.here_tokens_per_s else None
    here_usd = here_seconds * inputs.here_usd_per_hour / 3600 if here_seconds is not None else 0.0

    fetch = weights / weights_link + text / link
    extract = tokens / target_tps
    scenarios = {
        "A": {
            "name": "extract here, ship hidden states",
            "steps_s": {"extract_here": here_seconds, "transfer_hidden_states": stored / link},
            "rented_s": stored / link,
            "disk_bytes": (stored + checkpoints) * (1 + inputs.headroom),
        },
        "B": {
            "name": "ship text, extract on the rented machine",
            "steps_s": {"fetch_weights_and_text": fetch, "extract": extract},
            "rented_s": fetch + extract,
            "disk_bytes": (weights + text + stored + checkpoints) * (1 + inputs.headroom),
        },
        "C": {
            "name": "online training, no hidden states on disk",
            "steps_s": {"fetch_weights_and_text": fetch, "verifier_forward_all_epochs": inputs.epochs * extract},
            "rented_s": fetch + inputs.epochs * extract,
            "disk_bytes": (weights + text + checkpoints) * (1 + inputs.headroom),
        },
    }
    for key, scenario in scenarios.items():
        scenario["cost_usd"] = scenario["rented_s"] * machine_usd_per_s + (here_usd if key == "A" else 0.0)
        known = [s for s in scenario["steps_s"].values() if s is not None]
        scenario["wall_s"] = sum(known) if len(known) == len(scenario["steps_s"]) else None
        scenario["fits_disk"] = inputs.disk_tb is None or scenario["disk_bytes"] <= inputs.disk_tb * TB

    per_token_a = bytes_per_token / inputs.compression_ratio / link * machine_usd_per_s
    if here_seconds is not None:
        per_token_a += inputs.here_usd_per_hour / 3600 / inputs.here_tokens_per_s
    per_token_b = (TEXT_BYTES_PER_TOKEN / link + 1 / target_tps) * machine_usd_per_s
    fixed_b = weights / weights_link * machine_usd_per_s
    if per_token_a > per_token_b:
        n = fixed_b / (per_token_a - per_token_b)
        break_even = {
            "tokens": n,
            "samples": n / inputs.mean_tokens,
            "raw_bytes": n * bytes_per_token,
            "stored_bytes": n * bytes_per_token / inputs.compression_ratio,
            "meaning": "A is cheaper below this size, B above",
        }
    else:
        break_even = {
            "tokens": None,
            "samples": None,
            "raw_bytes": None,
            "stored_bytes": None,
            "meaning": "A is cheaper at any size: shipping a token's states costs less than extracting it there",
        }

    feasible = [k for k, s in scenarios.items() if s["fits_disk"]] or list(scenarios)
    best = min(feasible, key=lambda k: (round(scenarios[k]["cost_usd"], 2), scenarios[k]["wall_s"] or math.inf))
    reason = f"lowest rented-machine cost (${scenarios[best]['cost_usd']:,.0f})"
    if len(feasible) < len(scenarios):
        reason += f"; {', '.join(sorted(set(scenarios) - set(feasible)))} do not fit {inputs.disk_tb:g} TB of disk"
    if best == "C" and len(feasible) == len(scenarios):
        reason += "; it also needs no disk for hidden states"

    return {
        "inputs": {**{k: v for k, v in asdict(inputs).items() if k != "sources"}, "sources": inputs.sources},
        "tokens": tokens,
        "bytes_per_token": bytes_per_token,
        "hidden_states": {
            "raw_bytes": raw,
            "stored_bytes": stored,
            "largest_sample_bytes": inputs.max_tokens * bytes_per_token,
        },
        "text_bytes": text,
        "verifier_weights_bytes": weights,
        "draft_params": draft_params,
        "checkpoints_bytes": checkpoints,
        "rates": {
            "link_bytes_per_s": link,
            "flops_per_token": flops_per_token,
            "target_tokens_per_s": target_tps,
            "machine_usd_per_hour": machine_usd_per_s * 3600,
        },
        "scenarios": scenarios,
        "recommendation": {"scenario": best, "reason": reason},
        "break_even_a_vs_b": break_even,
    }
