"""`eagle3 plan`: disk, time and cost of the hero run before any money is spent.

Two machines: *here* (the user's own, which serves the verifier and generates the synthetic data) and *there* (the
rented GPU machine that trains the draft), joined by a link. The plan answers: how much disk each needs, and
whether to extract the hidden states here and ship them (A) or ship the text and extract there (B). Online training
(C) is estimated for comparison only: this pipeline does not implement it, so it is never recommended.

Not a DVC stage: it reads CLI flags (eagle3/tools/plan_cli.py) and, where present, the extract stage's metrics.
Every number comes from one of the formulas below; README.md ("Planning the hero run") walks through the seed case.

Units: 1 GB = 1e9 bytes, 1 TB = 1e12 bytes, 1 Gbit/s = 1e9 bit/s (as links and disks are sold).

Sizes
    tokens              = samples * mean_tokens
    bytes_per_token     = captured_layers * hidden_size * bytes_per_element
    raw                 = tokens * bytes_per_token
    stored              = raw / compression_ratio
    largest_sample      = max_tokens * bytes_per_token              (one record, held in memory while written)
    text                = tokens * TEXT_BYTES_PER_TOKEN             (prompts + synthetic answers, before zstd)
    train_tensors       = 2 * vocab_size * hidden_size * 2          (the verifier's embedding and lm_head in bf16:
                                                                     all of the verifier that training reads)
    draft_params        = 10 * H^2 + 3 * H * intermediate + draft_vocab * H
                          (fc 3H^2; q, k, v from 2H to H: 6H^2; o_proj H^2; gated MLP; draft lm_head;
                           embeddings are the verifier's and are not stored)
    checkpoints         = draft_params * CHECKPOINT_BYTES_PER_PARAM * keep_checkpoints

Disk (per machine and scenario; every pipeline output is DVC-tracked, the verifier's weights are not: the verifier
stage records where a local model is without copying it)
    cache               = 1 for hardlink, reflink or symlink (workspace and cache share the bytes), 2 for copy
    A here              = (stored + text) * cache * (1 + headroom)
    A there             = (stored * cache + train_tensors + checkpoints * cache) * (1 + headroom)
    B here, C here      = text * cache * (1 + headroom)
    B there             = (weights + (text + stored + checkpoints) * cache) * (1 + headroom)
    C there             = (weights + (text + checkpoints) * cache) * (1 + headroom)
    largest samples that fit = floor((disk_tb * 1e12 / (1 + headroom) - fixed) / per_sample), where disk(samples) =
                          (fixed + samples * per_sample) * (1 + headroom) is the scenario's formula above

Rates
    link                = link_gbit * 1e9 * link_efficiency / 8                      (bytes/s; likewise weights_link)
    flops_per_token     = 2 * active_params + 2 * num_layers * mean_tokens * hidden_size
                          (forward matmuls; causal attention averages mean_tokens / 2 keys per token, and
                           QK^T plus AV cost 2 * 2 * hidden FLOPs per key per layer)
    extract_tokens_per_s = gpus * gpu_tflops * 1e12 * mfu * share / flops_per_token  (share: 1 there; here, the
                          part of the GPUs extraction gets beside the server), unless given or measured
    train_tokens_per_s  = gpus_there * per_gpu, per_gpu = TRAIN_MEASURED.tokens_per_s * gpu_tflops / its tflops
                          unless given; train = epochs * tokens / train_tokens_per_s
    machine_usd_per_h   = gpus * usd_per_gpu_hour

Scenarios (rented time is what the bill counts; extraction here happens before renting and costs
here_usd_per_hour, 0 for an owned machine)
    A  rented = stored / link + train_tensors / weights_link + train
    B  rented = weights / weights_link + text / link + tokens / extract_there + train
    C  rented = weights / weights_link + text / link + epochs * tokens / extract_there + train   (estimate only)
    cost = rented * machine_usd_per_h  (+ for A: tokens / extract_here * here_usd_per_hour)

Break-even between A and B (training is the same in both and cancels):
    cost_A(N) = F_A + N * a,  F_A = train_tensors / weights_link * P,  a = stored_per_token / link * P + here_usd_tok
    cost_B(N) = F_B + N * b,  F_B = weights / weights_link * P,  b = (text_per_token / link + 1 / extract_there) * P
    (P: the rented machine's $/s; here_usd_tok: here_usd_per_hour / 3600 / extract_here)
    N* = (F_B - F_A) / (a - b) when a > b and F_B > F_A: A is cheaper below N*, B above. Otherwise the one with the
    lower per-token cost is cheaper at any size.
"""

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

GB, TB = 1e9, 1e12
# Prompts and answers as UTF-8 text: ~4 characters per token, before zstd.
TEXT_BYTES_PER_TOKEN = 4
# fp32 weights + AdamW's two fp32 moments, the state a resumable checkpoint must hold.
CHECKPOINT_BYTES_PER_PARAM = 12
# vLLM's default gpu_memory_utilization: the share of GPU memory it takes, weights and KV cache together.
GPU_MEMORY_UTILIZATION = 0.9
CACHE_LINKS = {"hardlink": 1, "reflink": 1, "symlink": 1, "copy": 2}


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


@dataclass(frozen=True)
class Gpu:
    name: str
    bf16_tflops: float  # dense (no sparsity), from NVIDIA's datasheets
    memory_gb: float
    usd_per_hour: float  # a typical on-demand price per GPU-hour in late 2026: an assumption to check


GPUS = {
    "b300": Gpu("NVIDIA B300 SXM", 2250, 288, 6.5),
    "b200": Gpu("NVIDIA B200 SXM", 2250, 180, 5.0),
    "h200": Gpu("NVIDIA H200 SXM", 989, 141, 3.5),
    "h100": Gpu("NVIDIA H100 SXM", 989, 80, 2.5),
    "h200-nvl": Gpu("NVIDIA H200 NVL (PCIe)", 836, 141, 3.0),
    "h100-pcie": Gpu("NVIDIA H100 PCIe", 756, 80, 2.0),
}


@dataclass(frozen=True)
class TrainMeasurement:
    gpu: str
    tokens_per_s: float
    sample_tokens: int
    ttt_steps: int
    longest_fitting_tokens: int


# This project's draft trainer at Kimi-K2.5's shape (1.14B trainable parameters) on one H200, bf16 autocast, fused
# AdamW, batch 1 (README "GPU measurements"), before its attention became linear in T: 6,144 tokens x 7 steps ran
# out of its 141 GB, 4,096 was the longest measured sample that fit. The only GPU figures so far.
TRAIN_MEASURED = TrainMeasurement("h200", 7134.0, 2048, 7, 4096)


@dataclass(frozen=True)
class Machine:
    gpu: str
    gpus: int
    tflops: float
    usd_per_gpu_hour: float
    disk_tb: float | None

    @property
    def memory_gb(self) -> float:
        return GPUS[self.gpu].memory_gb


@dataclass(frozen=True)
class Budget:
    low: float | None
    high: float


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
    there: Machine
    here: Machine
    here_share: float
    mfu: float
    there_tokens_per_s: float | None
    here_tokens_per_s: float | None
    here_usd_per_hour: float
    train_tokens_per_s_per_gpu: float | None
    epochs: int
    draft_vocab: int
    keep_checkpoints: int
    headroom: float
    cache_link: str
    # extract.storage the ratio is for, and every storage's ratio (the plan shows each beside the chosen one).
    storage: str = "bf16-lossless"
    storage_ratios: dict[str, float] = field(default_factory=dict)
    budget_usd: Budget | None = None
    budget_hours: Budget | None = None
    link_measurement: dict[str, Any] | None = None
    sources: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def extraction_rate(machine: Machine, mfu: float, share: float, flops_per_token: float) -> float:
    return machine.gpus * machine.tflops * 1e12 * mfu * share / flops_per_token


def train_rate_per_gpu(machine: Machine) -> float:
    return TRAIN_MEASURED.tokens_per_s * machine.tflops / GPUS[TRAIN_MEASURED.gpu].bf16_tflops


def largest_samples(disk_tb: float | None, headroom: float, fixed: float, per_sample: float) -> int | None:
    """Samples of the planned length that fit `disk_tb`; None where there is no limit to check."""
    if disk_tb is None or per_sample <= 0:
        return None
    return max(0, math.floor((disk_tb * TB / (1 + headroom) - fixed) / per_sample))


def _within(budget: Budget | None, value: float) -> str | None:
    if budget is None:
        return None
    if value > budget.high:
        return "over"
    return "below" if budget.low is not None and value < budget.low else "inside"


def compute(inputs: Inputs) -> dict[str, Any]:
    """The whole plan as plain numbers (bytes, seconds, dollars). Formulas: the module docstring."""
    v, there, here = inputs.verifier, inputs.there, inputs.here
    headroom = 1 + inputs.headroom
    cache = CACHE_LINKS[inputs.cache_link]
    tokens = inputs.samples * inputs.mean_tokens
    bytes_per_token = inputs.captured_layers * v.hidden_size * inputs.bytes_per_element
    raw = tokens * bytes_per_token
    stored_per_token = bytes_per_token / inputs.compression_ratio
    stored = raw / inputs.compression_ratio
    text = tokens * TEXT_BYTES_PER_TOKEN
    train_tensors = 2 * v.vocab_size * v.hidden_size * 2
    draft_params = 10 * v.hidden_size**2 + 3 * v.hidden_size * v.intermediate_size + inputs.draft_vocab * v.hidden_size
    checkpoints = draft_params * CHECKPOINT_BYTES_PER_PARAM * inputs.keep_checkpoints
    weights = v.weights_bytes

    link = inputs.link_gbit * 1e9 * inputs.link_efficiency / 8
    weights_link = inputs.weights_link_gbit * 1e9 * inputs.link_efficiency / 8
    flops_per_token = 2 * (v.active_params or 0) + 2 * v.num_layers * inputs.mean_tokens * v.hidden_size
    there_tps = inputs.there_tokens_per_s or extraction_rate(there, inputs.mfu, 1.0, flops_per_token)
    here_tps = inputs.here_tokens_per_s or extraction_rate(here, inputs.mfu, inputs.here_share, flops_per_token)
    per_gpu_train = inputs.train_tokens_per_s_per_gpu or train_rate_per_gpu(there)
    train_tps = there.gpus * per_gpu_train
    train_s = inputs.epochs * tokens / train_tps
    usd_per_s = there.gpus * there.usd_per_gpu_hour / 3600
    here_s = tokens / here_tps
    here_usd = here_s * inputs.here_usd_per_hour / 3600

    fetch_weights, ship_text = weights / weights_link, text / link
    extract_there = tokens / there_tps
    sample_text = TEXT_BYTES_PER_TOKEN * inputs.mean_tokens * cache
    sample_states = stored_per_token * inputs.mean_tokens * cache
    # (fixed bytes, bytes per sample) of each machine's disk formula, before headroom
    disk_terms = {
        "A": {
            "here": (0.0, sample_states + sample_text),
            "there": (train_tensors + checkpoints * cache, sample_states),
        },
        "B": {"here": (0.0, sample_text), "there": (weights + checkpoints * cache, sample_text + sample_states)},
        "C": {"here": (0.0, sample_text), "there": (weights + checkpoints * cache, sample_text)},
    }
    steps = {
        "A": {
            "ship_hidden_states": stored / link,
            "fetch_verifier_tensors": train_tensors / weights_link,
            "train": train_s,
        },
        "B": {"fetch_weights": fetch_weights, "ship_text": ship_text, "extract": extract_there, "train": train_s},
        "C": {
            "fetch_weights": fetch_weights,
            "ship_text": ship_text,
            "verifier_forward_all_epochs": inputs.epochs * extract_there,
            "train": train_s,
        },
    }
    names = {
        "A": "extract here, ship hidden states",
        "B": "ship text, extract on the rented machine",
        "C": "online training, no hidden states on disk (not implemented by this pipeline: estimate only)",
    }
    weights_fit_there = weights <= there.gpus * there.memory_gb * GB * GPU_MEMORY_UTILIZATION
    scenarios: dict[str, dict[str, Any]] = {}
    for key, terms in disk_terms.items():
        rented = sum(steps[key].values())
        disk = {}
        for side, machine in (("here", here), ("there", there)):
            fixed, per_sample = terms[side]
            need = (fixed + inputs.samples * per_sample) * headroom
            disk[side] = {
                "bytes": need,
                "budget_tb": machine.disk_tb,
                "fits": machine.disk_tb is None or need <= machine.disk_tb * TB,
                "largest_samples": largest_samples(machine.disk_tb, inputs.headroom, fixed, per_sample),
            }
        problems = [
            f"needs {size(disk[side]['bytes'])} {side}, more than its {size(disk[side]['budget_tb'] * TB)}"
            for side in ("here", "there")
            if not disk[side]["fits"]
        ]
        if key != "A" and not weights_fit_there:
            problems.append(
                f"the verifier's {weights / GB:,.0f} GB of weights do not fit {there.gpus} x {there.memory_gb:g} GB x "
                f"{GPU_MEMORY_UTILIZATION} of GPU memory there"
            )
        cost = rented * usd_per_s + (here_usd if key == "A" else 0.0)
        scenarios[key] = {
            "name": names[key],
            "implemented": key != "C",
            "rented_steps_s": steps[key],
            "here_steps_s": {"extract_here": here_s} if key == "A" else {},
            "rented_s": rented,
            "wall_s": rented + (here_s if key == "A" else 0.0),
            "cost_usd": cost,
            "disk": disk,
            "feasible": not problems,
            "problems": problems,
            "budget": {"usd": _within(inputs.budget_usd, cost), "hours": _within(inputs.budget_hours, rented / 3600)},
        }

    candidates = [k for k, s in scenarios.items() if s["implemented"] and s["feasible"]]
    best = min(candidates, key=lambda k: (round(scenarios[k]["cost_usd"], 2), scenarios[k]["rented_s"]), default=None)

    fixed_a = train_tensors / weights_link * usd_per_s
    fixed_b = fetch_weights * usd_per_s
    per_token_a = stored_per_token / link * usd_per_s + inputs.here_usd_per_hour / 3600 / here_tps
    per_token_b = (TEXT_BYTES_PER_TOKEN / link + 1 / there_tps) * usd_per_s
    if per_token_a > per_token_b and fixed_b > fixed_a:
        n = (fixed_b - fixed_a) / (per_token_a - per_token_b)
        break_even = {
            "tokens": n,
            "samples": n / inputs.mean_tokens,
            "raw_bytes": n * bytes_per_token,
            "stored_bytes": n * stored_per_token,
            "meaning": "A is cheaper below this size, B above",
        }
    else:
        cheaper = "A" if per_token_a <= per_token_b else "B"
        break_even = {
            "tokens": None,
            "samples": None,
            "raw_bytes": None,
            "stored_bytes": None,
            "meaning": f"{cheaper} is cheaper at any size",
        }

    plan = {
        "inputs": {k: value for k, value in asdict(inputs).items() if k not in ("sources", "warnings")}
        | {"sources": inputs.sources},
        "warnings": list(inputs.warnings),
        "tokens": tokens,
        "bytes_per_token": bytes_per_token,
        "hidden_states": {
            "raw_bytes": raw,
            "stored_bytes": stored,
            "largest_sample_bytes": inputs.max_tokens * bytes_per_token,
        },
        "text_bytes": text,
        "verifier_weights_bytes": weights,
        "verifier_train_tensors_bytes": train_tensors,
        "draft_params": draft_params,
        "checkpoints_bytes": checkpoints,
        "rates": {
            "link_bytes_per_s": link,
            "weights_link_bytes_per_s": weights_link,
            "flops_per_token": flops_per_token,
            "extract_there_tokens_per_s": there_tps,
            "extract_here_tokens_per_s": here_tps,
            "train_tokens_per_s": train_tps,
            "machine_usd_per_hour": usd_per_s * 3600,
        },
        "scenarios": scenarios,
        "recommendation": best,
        "break_even_a_vs_b": break_even,
    }
    plan["storage_options"] = [
        _storage_option(storage, ratio, compute(replace(inputs, compression_ratio=ratio, storage_ratios={})))
        for storage, ratio in inputs.storage_ratios.items()
    ]
    plan["answer"] = answer(plan)
    return plan


def _storage_option(storage: str, ratio: float, plan: dict[str, Any]) -> dict[str, Any]:
    """What one extract.storage changes: stored size, the disk each scenario needs there, shipping, time, cost."""
    scenarios = plan["scenarios"]
    return {
        "storage": storage,
        "compression_ratio": ratio,
        "stored_bytes": plan["hidden_states"]["stored_bytes"],
        "ship_hidden_states_s": scenarios["A"]["rented_steps_s"]["ship_hidden_states"],
        "scenarios": {
            key: {
                "there_disk_bytes": scenarios[key]["disk"]["there"]["bytes"],
                "rented_s": scenarios[key]["rented_s"],
                "cost_usd": scenarios[key]["cost_usd"],
                "feasible": scenarios[key]["feasible"],
            }
            for key in ("A", "B")
        },
        "recommendation": plan["recommendation"],
    }


def size(value: float | None) -> str:
    if value is None:
        return "n/a"
    if value >= TB:
        return f"{value / TB:,.2f} TB"
    return f"{value / GB:,.1f} GB" if value >= GB else f"{value / 1e6:,.1f} MB"


def dollars(value: float) -> str:
    return f"${value:,.0f}" if value >= 10 else f"${value:,.2f}"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    if seconds >= 3600:
        return f"{seconds / 3600:,.1f} h"
    return f"{seconds / 60:,.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


def _disk_need(scenario: dict[str, Any], side: str) -> str:
    disk = scenario["disk"][side]
    text = size(disk["bytes"])
    if disk["budget_tb"] is not None:
        text += f" of {disk['budget_tb']:g} TB" + ("" if disk["fits"] else " (does not fit)")
    return text


def _budget_words(budget: dict[str, Any], unit: str) -> str:
    if budget["low"] is None:
        return f"the budget of {unit}{budget['high']:g}"
    return f"{unit}{budget['low']:g}-{budget['high']:g}"


def answer(plan: dict[str, Any]) -> list[str]:
    """The two questions answered in words (disk; extract there or ship), then the budget check where one is given."""
    inputs, scenarios = plan["inputs"], plan["scenarios"]
    a, b = scenarios["A"], scenarios["B"]
    link = plan["rates"]["link_bytes_per_s"] * 8 / 1e9
    lines = [
        f"Disk: the rented machine needs {_disk_need(b, 'there')} to extract there (B), or {_disk_need(a, 'there')} "
        f"to receive shipped hidden states (A); here A needs {_disk_need(a, 'here')} "
        f"(DVC cache link {inputs['cache_link']}, +{inputs['headroom']:.0%} headroom)."
    ]
    best = plan["recommendation"]
    even = plan["break_even_a_vs_b"]
    if even["samples"] is not None:
        trade = (
            f"shipping is cheaper below {even['samples']:,.0f} samples of this length "
            f"({size(even['stored_bytes'])} stored), extracting there above"
        )
    else:
        trade = f"{'shipping' if even['meaning'].startswith('A') else 'extracting there'} is cheaper at any size"
    ship = f"ship {size(plan['hidden_states']['stored_bytes'])} over {link:.2f} Gbit/s"
    if best is None:
        limits = "; ".join(
            f"{key}: {', '.join(s['problems'])}"
            + "".join(
                f" (at most {s['disk'][side]['largest_samples']:,} samples of this length fit {side})"
                for side in ("here", "there")
                if not s["disk"][side]["fits"]
            )
            for key, s in (("A", a), ("B", b))
        )
        lines.append(f"Neither layout works with these inputs: {limits}.")
        return lines
    chosen, other = (b, a) if best == "B" else (a, b)
    verb = "Extract on the rented machine (B)" if best == "B" else f"Extract here and {ship} (A)"
    alternative = f"{ship} (A)" if best == "B" else "extract there (B)"
    if other["feasible"]:
        versus = f"{alternative}: {duration(other['rented_s'])}, {dollars(other['cost_usd'])}"
    else:
        versus = f"{alternative} is ruled out: {', '.join(other['problems'])}"
    lines.append(f"{verb}: {duration(chosen['rented_s'])} rented, {dollars(chosen['cost_usd'])} ({versus}); {trade}.")
    usd, hours = inputs["budget_usd"], inputs["budget_hours"]
    if usd is not None or hours is not None:
        verdicts = []
        if usd is not None:
            verdicts.append(f"{dollars(chosen['cost_usd'])} is {chosen['budget']['usd']} {_budget_words(usd, '$')}")
        if hours is not None:
            used = f"{chosen['rented_s'] / 3600:.2g} h"
            verdicts.append(f"{used} is {chosen['budget']['hours']} {_budget_words(hours, '')} h")
        lines.append(f"Budget ({best}, training included): " + "; ".join(verdicts) + ".")
    return lines
