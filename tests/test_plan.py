"""`eagle3 plan` through the real CLI: every figure against a hand computation, and one error line per bad input.
(Longer than most modules: one hand computation per section of the plan.)"""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import eagle3, tmpfs

# The training-memory estimate measured by the module's first plan, read by the later ones.
pytestmark = pytest.mark.usefixtures("train_memory_cache")

DVC = str(Path(sys.executable).with_name("dvc"))
SEED = ("--samples", "3000", "--mean-tokens", "16384")


def _metrics(root: Path, ratio: float = 1.476, tokens_per_s: float | None = None) -> Path:
    path = root / "metrics" / "extract.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "compression_ratio": ratio,
                "raw_bytes_per_token": 4608,
                "stored_bytes_per_token": 3122.1,
                "this_run": {"tokens_per_s": tokens_per_s},
            }
        )
    )
    return path


def _plan(root: Path, *args: str) -> dict:
    return json.loads(eagle3(root, "plan", *args, "--json").stdout)


def _error(root: Path, *args: str) -> str:
    result = eagle3(root, "plan", *args, check=False)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("eagle3 plan: error: ")
    return lines[0]


def _provenance(root: Path, name: str) -> None:
    path = root / "models" / "verifier" / "provenance.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"name": name}))


# The seed case by hand: Kimi-K2.5 (hidden 7168, 61 layers, vocab 163840, 32e9 active, 600 GB), 3000 x 16384 tokens.
TOKENS = 3000 * 16384  # 49,152,000
RAW = TOKENS * 4 * 7168 * 2  # 57,344 B/token: 2,818,572,288,000 B
STORED = RAW / 1.476
TEXT = TOKENS * 4
FLOPS = 2 * 32e9 + 2 * 61 * 16384 * 7168  # 78,327,742,464 per token
EXTRACT_B200 = 8 * 2250e12 * 0.3 / FLOPS  # 68,941 tokens/s
EXTRACT_H200_NVL = 8 * 836e12 * 0.3 / FLOPS  # 25,615 tokens/s
TRAIN_B200 = 8 * 7134 * 2250 / 989  # 129,840 tokens/s


def _newton_schulz(m: int, n: int) -> int:
    """FLOPs of torch.optim.Muon's 5 iterations on an m x n update, m <= n: X Xᵀ, A², (bA + cA²) X."""
    return 5 * (2 * m * m * n + 2 * m**3 + 2 * m * m * n)


# The shipped configuration's optimizer, muon, orthogonalises each of the draft's matrices once per optimizer step on
# every GPU: fc, q/k/v (64 heads x 128 over the embedding and the hidden state), o, and the MLP's three.
NEWTON_SCHULZ = (
    _newton_schulz(7168, 21504) + 3 * _newton_schulz(8192, 14336) + _newton_schulz(7168, 8192)
) + 3 * _newton_schulz(7168, 18432)
MUON_STEP_S = NEWTON_SCHULZ / (2250e12 * 0.5)  # 0.16 s at half of a B200's dense bf16 peak
# 4 epochs of 3000 samples; an optimizer step takes the shipped 163,840-token budget: 10 samples of 16,384.
TRAIN_S = 4 * TOKENS / TRAIN_B200 + 4 * 3000 / 10 * MUON_STEP_S  # 1,514 s + 192 s
# The draft the trainer builds for Kimi-K2.5 (its config's attention is MLA: the draft gets 64 heads x 128) with the
# shipped EAGLE 3.1 layout: fc 3H x H, q/k/v 2H -> 8192, o, the MLP, the head, and the layout's norms.
H, MLP, Q = 7168, 18432, 8192
DRAFT = 3 * H * H + 3 * 2 * H * Q + Q * H + 3 * H * MLP + 32000 * H + 7 * H  # 1,190,970,368
assert DRAFT == 1_190_970_368
# One checkpoint: the draft in fp32 and its aux-scale buffer (3H), Muon's momentum for every matrix but the head,
# AdamW's two moments and a step count for the head and the 7 norms; the shipped configuration keeps 2.
MATRICES = DRAFT - 32000 * H - 7 * H
CHECKPOINT = 4 * DRAFT + 4 * 3 * H + 4 * MATRICES + 8 * (32000 * H + 7 * H) + 4 * 8
CHECKPOINTS = CHECKPOINT * 2
TRAINED_PARAMS = DRAFT
LINK = 5e9 * 0.8 / 8  # 5e8 B/s; the DVC remote's speeds are assumed to be the link's
USD_PER_S = 8 * 5.0 / 3600
# The runbook's steps the formulas add (eagle3/plan/model.py): a start of the verifier (its 600 GB at 2 GB/s + 1
# min), preflight (its items' budgets and two engine starts: serving, and extraction on vLLM), setup and gpu-check
# (the sum of its time boxes), hashing the weights once on each machine (600 GB at the disk's 2 GB/s).
START = 600e9 / 2e9 + 60  # 360 s
HASH = 600e9 / 2e9
PREFLIGHT = 6 + 20 + 30 + 20 + 20 + 20 + 10 + 2 * START
GPU_CHECK = 120 + 90 + 180 + 75 + 240 + 150
# Rented in every layout: setup, gpu-check, the weights (every layout evaluates there) and their hash, the text,
# preflight, the checkpoints sent back (no params file: no evaluation is priced).
EVERY_LAYOUT = 900 + GPU_CHECK + 600e9 / LINK + HASH + TEXT / LINK + PREFLIGHT + CHECKPOINTS / LINK
# Here's disk: 3 TB less the verifier's 600 GB kept on it.
HERE_DISK = 3e12 - 600e9


def _trainers_draft() -> int:
    """The parameters of the draft the train stage builds (DraftConfig.for_training) for Kimi-K2.5 with the shipped
    configuration's train settings, on vLLM's default aux layers: counted on the meta device."""
    import torch

    from eagle3.modeling.draft import DraftConfig, Eagle3Draft
    from eagle3.plan.configured import shipped_params
    from eagle3.plan.facts import KIMI_K2_5_TEXT_CONFIG

    params = shipped_params()
    config = DraftConfig.for_training(KIMI_K2_5_TEXT_CONFIG, (2, 30, 58), params.vocab.draft_vocab_size, params.train)
    with torch.device("meta"):
        return sum(p.numel() for p in Eagle3Draft(config).parameters())


def test_seed_case_kimi(tmp_path):
    _metrics(tmp_path)
    _provenance(tmp_path, "HuggingFaceTB/SmolLM2-135M-Instruct")
    plan = _plan(tmp_path, *SEED, "--budget-usd", "180-900", "--budget-hours", "6-18")
    assert plan["bytes_per_token"] == 57_344 and plan["tokens"] == TOKENS
    assert plan["hidden_states"]["raw_bytes"] == RAW == 2_818_572_288_000
    assert plan["hidden_states"]["stored_bytes"] == pytest.approx(STORED)
    assert plan["verifier_weights_bytes"] == 600e9 and plan["draft_params"] == DRAFT == _trainers_draft()
    rates = plan["rates"]
    assert rates["flops_per_token"] == FLOPS == 78_327_742_464
    assert rates["extract_there_tokens_per_s"] == pytest.approx(EXTRACT_B200)
    assert rates["extract_here_tokens_per_s"] == pytest.approx(EXTRACT_H200_NVL)
    assert rates["train_tokens_per_s"] == pytest.approx(TRAIN_B200)
    assert rates["machine_usd_per_hour"] == 40.0  # 8 x B200 at the preset's $5/GPU-hour

    a, b, c = (plan["scenarios"][k] for k in "ABC")
    common = {
        "setup": 900,
        "gpu_check": GPU_CHECK,
        "fetch_weights": 1200,
        "hash_weights": HASH,
        "ship_text": TEXT / LINK,
        "preflight": PREFLIGHT,
        "train": TRAIN_S,
        "push_results": CHECKPOINTS / LINK,
    }
    assert a["rented_steps_s"] == pytest.approx({**common, "ship_hidden_states": STORED / LINK})
    # Here, before renting: the weights hashed, 3,000 answers of 16,384 tokens at the assumed 250 tokens/s per GPU of
    # 8 (no params file: one answer per sample), and one start of the verifier; in A the states extracted and pushed.
    generate = 3000 * 16384 / 2000 + START
    assert a["here_steps_s"] == pytest.approx(
        {
            "verifier": HASH,
            "generate": generate,
            "extract_here": TOKENS / EXTRACT_H200_NVL + START,
            "push_hidden_states": STORED / LINK,
        }
    )
    assert b["here_steps_s"] == pytest.approx({"verifier": HASH, "generate": generate})
    assert b["rented_steps_s"] == pytest.approx({**common, "extract": TOKENS / EXTRACT_B200 + START})
    assert c["rented_steps_s"]["verifier_forward_all_epochs"] == pytest.approx(4 * TOKENS / EXTRACT_B200 + START)
    assert b["rented_s"] == pytest.approx(EVERY_LAYOUT + TOKENS / EXTRACT_B200 + START + TRAIN_S)  # 1.7 h
    assert b["cost_usd"] == pytest.approx(b["rented_s"] * USD_PER_S)  # $70
    assert a["cost_usd"] == pytest.approx(a["rented_s"] * USD_PER_S)  # owned here: $0 for extracting there
    # Each step says what it counts.
    (generated,) = [step for step in b["steps"] if step["name"] == "generate"]
    assert generated["machine"] == "here" and generated["counted"] == {
        "answers": 3000,
        "tokens": 3000 * 16384,
        "server_starts": 1,
    }
    (fetched,) = [step for step in b["steps"] if step["name"] == "fetch_weights"]
    assert fetched["counted"] == {"bytes": 600e9}
    # Disk with hardlinked DVC cache (shared bytes) and 20% headroom; A holds the weights there to evaluate.
    assert a["disk"]["there"]["bytes"] == pytest.approx((600e9 + TEXT + STORED + CHECKPOINTS) * 1.2)  # 3.06 TB
    assert a["disk"]["here"]["bytes"] == pytest.approx((STORED + TEXT) * 1.2)  # 2.29 TB
    assert b["disk"]["there"]["bytes"] == pytest.approx((600e9 + TEXT + STORED + CHECKPOINTS) * 1.2)  # 3.06 TB
    # Streamed (C): no states on disk, only the buffer (--stream-buffer-gb, 64 GB by default).
    assert c["disk"]["there"]["bytes"] == pytest.approx((600e9 + TEXT + CHECKPOINTS + 64e9) * 1.2)
    # Here is the 3 TB volume less the weights: (2.4e12 / 1.2) / ((57,344 / 1.476 + 4) x 16,384) = 3,141 samples.
    assert a["disk"]["here"]["fits"] and a["disk"]["here"]["largest_samples"] == 3141
    assert math.floor(HERE_DISK / 1.2 / ((57_344 / 1.476 + 4) * 16384)) == 3141
    assert a["disk"]["there"]["budget_tb"] is None and a["disk"]["there"]["largest_samples"] is None
    # Break-even: (F_B - F_A) / (a - b): both fetch the weights; B starts an engine to extract on vLLM.
    per_a = 57_344 / 1.476 / LINK * USD_PER_S
    per_b = USD_PER_S / EXTRACT_B200
    tokens = START * USD_PER_S / (per_a - per_b)
    assert plan["break_even_a_vs_b"]["tokens"] == pytest.approx(tokens)
    assert 347 < plan["break_even_a_vs_b"]["samples"] < 349
    assert plan["recommendation"] == "B" and c["feasible"]
    assert b["budget"] == {"usd": "below", "hours": "below"}

    # Largest run: B and C are bound by the 18 h, A by the 3 TB here. Each is linear in samples: the rented time
    # without any (the fixed steps) plus a sample's shipping, extraction and training.
    fixed = EVERY_LAYOUT - TEXT / LINK + START
    # rented seconds per sample, a 10th of an optimizer step in each epoch among them
    per_b = 16384 * (4 / LINK + 1 / EXTRACT_B200 + 4 / TRAIN_B200) + 4 / 10 * MUON_STEP_S
    per_c = 16384 * (4 / LINK + 4 / EXTRACT_B200 + 4 / TRAIN_B200) + 4 / 10 * MUON_STEP_S  # a forward every epoch
    largest = plan["largest_runs"]
    assert largest["A"]["samples"] == 3141 and largest["A"]["bounded_by"] == "disk here"
    assert largest["A"]["disk_there_bytes"] == pytest.approx(
        (600e9 + 3141 * 16384 * (57_344 / 1.476 + 4) + CHECKPOINTS) * 1.2
    )
    most_b = math.floor((18 * 3600 - fixed) / per_b)
    assert largest["B"]["limits"] == {
        "budget usd": math.floor((900 / USD_PER_S - fixed) / per_b),
        "budget hours": most_b,
        "disk here": math.floor(HERE_DISK / 1.2 / (4 * 16384)),
    }
    assert largest["B"]["bounded_by"] == "budget hours" and largest["B"]["samples"] == most_b
    most_c = math.floor((18 * 3600 - fixed) / per_c)
    assert largest["C"]["samples"] == most_c
    assert largest["B"]["disk_there_bytes"] == pytest.approx(
        (600e9 + CHECKPOINTS + most_b * 16384 * (4 + 57_344 / 1.476)) * 1.2
    )

    recommended, disk, decision, budget, most = plan["answer"]
    assert (most_b, most_c) == (74_762, 39_682)
    assert most == (
        "Largest run within the given budgets and disks, in samples of this length: A 3,141 (disk here; the rented "
        "machine's disk then needs 3.14 TB), B 74,762 (budget hours; the rented machine's disk then needs 57.86 TB), "
        "C 39,682 (budget hours; the rented machine's disk then needs 825.0 GB)."
    )
    assert largest["C"]["disk_there_bytes"] == pytest.approx((600e9 + CHECKPOINTS + 64e9 + most_c * 16384 * 4) * 1.2)
    # The answer first, in words, with the command that sets the params for it.
    assert recommended == (
        "Recommended: layout B (extract on the rented machine): 1.9 h rented, $77; `eagle3 init kimi-k2.5 --layout B "
        "--gpu b200` sets a shipped configuration for it."
    )
    assert disk.startswith(
        "Disk: the rented machine needs 3.04 TB to extract there (B), 3.04 TB to receive shipped hidden states (A), "
        "or 822.1 GB to stream them (C, 64 GB of buffer)"
    )
    assert "here A needs 2.29 TB of 2.4 TB" in disk and "hardlink" in disk
    assert decision.startswith(
        "Extract on the rented machine (B): 1.9 h rented, $77 (ship 1.91 TB through the DVC remote at 4.00 Gbit/s "
        "(A): 2.7 h, $107; stream there (C): 2.5 h, $101); between A and B, shipping is cheaper below 348 samples"
    )
    assert budget == "Budget (B, training included): $77 is below $180-900; 1.9 h is below 6-18 h."
    warnings = " ".join(plan["warnings"])
    assert "measured on HuggingFaceTB/SmolLM2-135M-Instruct's states, not moonshotai/Kimi-K2.5's" in warnings
    assert "cache.type hardlink,symlink" in warnings
    assert "activation_checkpointing" not in warnings  # 16K tokens x 7 TTT steps trains on a B200 as it is

    # Training memory per B200 (one of 8 DDP processes), from the estimate's line per setting.
    lines, memory = plan["inputs"]["train_memory"]["lines"], plan["train_memory"]
    assert list(lines) == list(memory["settings"]) == ["off", "mlp", "full"]
    assert memory["memory_bytes"] == 180e9 and (memory["processes"], memory["sharding"]) == (8, "ddp")
    for name, line in lines.items():
        at_16k = line["fixed_bytes"] + line["bytes_per_token"] * 16384
        setting = memory["settings"][name]
        assert setting["at_max_tokens_bytes"] == pytest.approx(at_16k) and setting["fits"] == (at_16k <= 180e9)
        assert setting["longest_tokens"] == int((180e9 - line["fixed_bytes"]) // line["bytes_per_token"])
        assert setting["resting_bytes"] == line["fixed_bytes"]
    # Recompute trades memory per token for compute; what every setting holds (weights, gradients, DDP's copy of them
    # and Muon's momentum, AdamW's two moments for the head: ~16 B per parameter; the verifier's bf16 embedding and
    # head rows) is the same.
    per_token = [line["bytes_per_token"] for line in lines.values()]
    assert per_token == sorted(per_token, reverse=True) and per_token[-1] < 0.5 * per_token[0]
    fixed = TRAINED_PARAMS * 16 + (163840 + 32000) * 7168 * 2
    assert all(fixed < line["fixed_bytes"] < fixed + 6e9 for line in lines.values())
    assert memory["settings"]["full"]["at_max_tokens_bytes"] <= 40 * 2**30 + TRAINED_PARAMS * 4
    assert memory["settings"]["off"]["at_max_tokens_bytes"] <= 72 * 2**30 + TRAINED_PARAMS * 4

    table = eagle3(tmp_path, "plan", *SEED).stdout
    assert table.index("Disk: the rented machine") < table.index("Sizes")
    assert "57,344 B" in table and "2.82 TB" in table and "* B" in table
    assert "The run in layout B, step by step (docs/hero-run.md): 1.9 h rented, $77" in table
    # The draft's size is the trainer's, to the parameter.
    assert f"{DRAFT:,} parameters in fp32 and muon's state) x 2 kept" in table
    assert "Training memory per NVIDIA B200 SXM (180 GB;" in table
    longest = memory["settings"]["full"]["longest_tokens"]
    assert f"{longest:,} tokens" in table


def test_training_memory_names_the_setting_that_fits_or_the_longest_sample(tmp_path):
    lines = _plan(tmp_path, *SEED, "--compression-ratio", "1.5")["inputs"]["train_memory"]["lines"]
    at = {name: line["fixed_bytes"] + line["bytes_per_token"] * 28672 for name, line in lines.items()}
    # An H100's 80 GB: 28K tokens need more than that with recompute off, less with the MLP recomputed.
    assert at["off"] > 80e9 >= at["mlp"], at
    warnings = _plan(tmp_path, *SEED, "--compression-ratio", "1.5", "--gpu", "h100", "--max-tokens", "28672")[
        "warnings"
    ]
    (warning,) = [w for w in warnings if "activation_checkpointing" in w]
    assert warning.startswith(f"28,672 tokens per training process need {at['off'] / 1e9:,.0f} GB per GPU")
    assert f"set it to mlp ({at['mlp'] / 1e9:,.0f} GB, estimated)" in warning
    # 64K tokens do not train there at all; the longest that does with full recompute is (80 GB - fixed) / per token.
    full = lines["full"]
    longest = int((80e9 - full["fixed_bytes"]) // full["bytes_per_token"])
    warnings = _plan(tmp_path, *SEED, "--compression-ratio", "1.5", "--gpu", "h100", "--max-tokens", "65536")[
        "warnings"
    ]
    (warning,) = [w for w in warnings if "activation_checkpointing" in w]
    assert (
        "do not train on one NVIDIA H100 SXM (80 GB, 8 x ddp) even with train.activation_checkpointing: full" in warning
    )
    assert warning.endswith(f"the longest that does is {longest:,} tokens")
    # FSDP over the 8 GPUs (with AdamW: Muon needs whole matrices): each holds an eighth of the weights and AdamW
    # state (12 B per parameter) and no gradient copy, but gathers the whole weights for the step: 7/8 x 12 B per
    # parameter less than DDP with AdamW.
    adamw = ("--compression-ratio", "1.5", "--optimizer", "adamw")
    lines = _plan(tmp_path, *SEED, *adamw)["inputs"]["train_memory"]["lines"]
    sharded = _plan(tmp_path, *SEED, *adamw, "--sharding", "fsdp")["train_memory"]["settings"]
    for name, line in lines.items():
        saved = line["fixed_bytes"] + line["bytes_per_token"] * 16384 - sharded[name]["at_max_tokens_bytes"]
        assert saved == pytest.approx(7 / 8 * 12 * TRAINED_PARAMS, rel=1e-3), name


def test_storage_options_from_a_ratio_measured_with_another_storage(tmp_path):
    from eagle3.plan.measured import STORAGE_GAIN

    _metrics(tmp_path)  # 1.476, an older metrics file without "storage": lossless
    _provenance(tmp_path, "HuggingFaceTB/SmolLM2-135M-Instruct")
    plan = _plan(tmp_path, *SEED, "--storage", "fp8")
    fp8_ratio = 1.476 * STORAGE_GAIN["fp8"]
    assert plan["inputs"]["storage"] == "fp8" and plan["inputs"]["compression_ratio"] == pytest.approx(fp8_ratio)
    assert plan["hidden_states"]["stored_bytes"] == pytest.approx(RAW / fp8_ratio)
    assert "measured with storage bf16-lossless" in plan["inputs"]["sources"]["compression_ratio"]
    assert f"x{STORAGE_GAIN['fp8']:.3f} for fp8" in plan["inputs"]["sources"]["compression_ratio"]
    options = {o["storage"]: o for o in plan["storage_options"]}
    assert list(options) == ["bf16-lossless", "fp8-aux", "fp8", "fp8-compact"]
    for storage, option in options.items():
        ratio = 1.476 * STORAGE_GAIN[storage]
        assert option["compression_ratio"] == pytest.approx(ratio)
        assert option["stored_bytes"] == pytest.approx(RAW / ratio)
        assert option["ship_hidden_states_s"] == pytest.approx(RAW / ratio / LINK)
        assert option["scenarios"]["A"]["there_disk_bytes"] == pytest.approx(
            (600e9 + TEXT + RAW / ratio + CHECKPOINTS) * 1.2
        )
        assert option["scenarios"]["B"]["there_disk_bytes"] == pytest.approx(
            (600e9 + TEXT + RAW / ratio + CHECKPOINTS) * 1.2
        )
    assert options["bf16-lossless"]["stored_bytes"] == pytest.approx(STORED)
    # Shipping shrinks with the ratio, so A's rented time and cost fall; B only saves disk.
    assert options["fp8"]["scenarios"]["A"]["cost_usd"] < options["bf16-lossless"]["scenarios"]["A"]["cost_usd"]
    assert options["fp8"]["scenarios"]["B"]["rented_s"] == pytest.approx(
        options["bf16-lossless"]["scenarios"]["B"]["rented_s"]
    )

    # Metrics measured with fp8: asking for lossless divides the gain back out.
    metrics = json.loads((tmp_path / "metrics" / "extract.json").read_text())
    (tmp_path / "metrics" / "extract.json").write_text(
        json.dumps({**metrics, "compression_ratio": 3.0, "storage": "fp8"})
    )
    assert _plan(tmp_path, *SEED)["inputs"]["storage"] == "fp8"
    lossless = _plan(tmp_path, *SEED, "--storage", "bf16-lossless")
    assert lossless["inputs"]["compression_ratio"] == pytest.approx(3.0 / STORAGE_GAIN["fp8"])
    rendered = eagle3(tmp_path, "plan", *SEED, "--storage", "fp8-aux").stdout
    assert "Hidden-state storage (extract.storage)" in rendered and "* fp8-aux" in rendered


def test_every_formula_against_hand_computation(tmp_path):
    model = tmp_path / "verifier"
    model.mkdir()
    # A multimodal config keeps the language model's shape under text_config.
    (model / "config.json").write_text(
        json.dumps(
            {
                "_name_or_path": "toy",
                "text_config": {
                    "hidden_size": 1000,
                    "num_hidden_layers": 10,
                    "vocab_size": 5000,
                    "intermediate_size": 4000,
                },
            }
        )
    )
    (model / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 10_000_000_000}, "weight_map": {}})
    )
    flags = {
        "--verifier": str(model),
        "--samples": "100",
        "--mean-tokens": "1000",
        "--max-tokens": "2000",
        "--compression-ratio": "2",
        "--link-gbit": "8",
        "--link-efficiency": "0.5",
        "--weights-link-gbit": "16",
        "--extract-tokens-per-s": "100000",
        "--gpu": "h100",
        "--gpus": "4",
        "--gpu-usd-per-hour": "3",
        "--epochs": "2",
        "--draft-vocab": "1000",
        "--keep-checkpoints": "2",
        "--headroom": "0.25",
        "--here-tokens-per-s": "20000",
        "--here-usd-per-hour": "6",
        "--train-tokens-per-s": "500",
        "--cache-link": "copy",
        "--disk-tb": "0.02",
        "--here-disk-tb": "0.001",
        "--budget-usd": "0.5",
        "--budget-hours": "0.01-1",
        "--stream-buffer-gb": "1",
        "--serve-tokens-per-s": "1000",
        "--server-start-min": "1",
    }
    plan = _plan(tmp_path, *(part for pair in flags.items() for part in pair))
    assert plan["inputs"]["verifier"]["hidden_size"] == 1000 and plan["verifier_weights_bytes"] == 1e10
    # A config without attention heads: the draft (and its memory) is built with heads of 128 assumed, or the largest
    # even size below that divides the hidden size: 10 of 100; and the shipped EAGLE 3.1 layout (a norm per captured
    # layer before fc).
    assert plan["inputs"]["sources"]["draft"].endswith("(10 heads of 100 assumed: the verifier's config gives none)")
    assert plan["train_memory"]["settings"] is not None
    assert plan["tokens"] == 100_000
    assert plan["bytes_per_token"] == 8_000  # 4 x 1000 x 2
    assert plan["hidden_states"] == {"raw_bytes": 8e8, "stored_bytes": 4e8, "largest_sample_bytes": 1.6e7}
    assert plan["text_bytes"] == 4e5
    # fc 3H x H; q, k, v from 2H to 10 x 100; o back; the gated MLP; the head (draft vocab 1000); 7 norms of H.
    matrices = 3 * 1000 * 1000 + 3 * 2000 * 1000 + 1000 * 1000 + 3 * 1000 * 4000
    head_and_norms = 1000 * 1000 + 7 * 1000
    assert plan["draft_params"] == matrices + head_and_norms == 23_007_000
    # A checkpoint (Muon, the shipped optimizer): fp32 weights and fc's input scale (3H), Muon's momentum per matrix,
    # AdamW's two moments and step count for the head and each norm; 2 kept.
    checkpoint = 4 * (matrices + head_and_norms) + 4 * 3000 + 4 * matrices + 8 * head_and_norms + 4 * 8
    assert plan["checkpoints_bytes"] == 2 * checkpoint == 376_192_064
    rates = plan["rates"]
    assert rates["link_bytes_per_s"] == 5e8 and rates["weights_link_bytes_per_s"] == 1e9  # x 0.5 / 8
    # The DVC remote's speeds, not given: the link's.
    assert rates["remote_up_bytes_per_s"] == rates["remote_down_bytes_per_s"] == 5e8
    assert rates["hash_bytes_per_s"] == 2e9  # the disk's, below 16 threads of sha256
    assert rates["machine_usd_per_hour"] == 12.0 and rates["train_tokens_per_s"] == 2000  # 4 GPUs x 500
    # Serving there: here's 1000 tokens/s per GPU and TFLOP/s (8 x 836), on 4 x 989.
    assert rates["serve_here_tokens_per_s"] == 1000 and rates["server_start_s"] == 60
    assert rates["serve_there_tokens_per_s"] == pytest.approx(1000 / 8 / 836 * 4 * 989)

    a, b, c = (plan["scenarios"][k] for k in "ABC")
    # setup 900, gpu-check 855 (the sum of its boxes); weights 1e10 / 1e9, hashed at 2e9; text 4e5 / 5e8;
    # preflight: its budgets (126 s) and two starts (serving; extraction on vLLM: no params, so the hero's backend);
    # train 2 epochs x 1e5 / 2000 plus 2 x 100 / 16 Muon steps; the checkpoints / 5e8; no params: no evaluation
    # priced, no held-out tokens to estimate from.
    muon = plan["rates"]["optimizer_step_s"]
    every = {
        "setup": 900,
        "gpu_check": 855,
        "fetch_weights": 10,
        "hash_weights": 5,
        "ship_text": 8e-4,
        "preflight": 246,
        "train": 100 + 2 * 100 / 16 * muon,
        "push_results": 2 * checkpoint / 5e8,
    }
    rented = sum(every.values())
    assert a["rented_steps_s"] == pytest.approx({**every, "ship_hidden_states": 0.8})  # 4e8 / 5e8
    # Here: the weights hashed; 100 answers x 1000 tokens / 1000 tokens/s + a start; extraction 1e5 / 2e4 + a start;
    # the states pushed to the remote, 4e8 / 5e8.
    assert a["here_steps_s"] == pytest.approx(
        {"verifier": 5, "generate": 160, "extract_here": 65, "push_hidden_states": 0.8}
    )
    assert a["rented_s"] == pytest.approx(rented + 0.8) and a["wall_s"] == pytest.approx(rented + 0.8 + 230.8)
    assert a["cost_usd"] == pytest.approx((rented + 0.8) * 12 / 3600 + 65 * 6 / 3600)  # rented + extraction here
    assert b["rented_steps_s"] == pytest.approx({**every, "extract": 61})  # 1e5 / 1e5 + a start
    assert b["cost_usd"] == pytest.approx((rented + 61) * 12 / 3600)
    assert c["rented_s"] == pytest.approx(rented + 62)  # two epochs of the verifier forward + a start
    # A copying DVC cache stores every tracked output twice; the verifier's weights are not tracked.
    checkpoints = 2 * checkpoint
    assert a["disk"]["there"]["bytes"] == pytest.approx((1e10 + (4e5 + 4e8 + checkpoints) * 2) * 1.25)
    assert a["disk"]["here"]["bytes"] == pytest.approx((4e8 + 4e5) * 2 * 1.25)
    assert b["disk"]["there"]["bytes"] == pytest.approx((1e10 + (4e5 + 4e8 + checkpoints) * 2) * 1.25)
    assert c["disk"]["there"]["bytes"] == pytest.approx((1e10 + (4e5 + checkpoints) * 2 + 1e9) * 1.25)
    assert b["disk"]["here"]["bytes"] == c["disk"]["here"]["bytes"] == pytest.approx(4e5 * 2 * 1.25)
    # Largest samples: (2e10 / 1.25 - fixed) / per sample, a sample being 1000 x (4000 B of states + 4 B of text) x 2.
    assert a["disk"]["there"]["largest_samples"] == b["disk"]["there"]["largest_samples"]
    assert b["disk"]["there"]["largest_samples"] == (16e9 - 1e10 - 2 * checkpoints) // 8.008e6 == 655
    assert a["disk"]["here"]["largest_samples"] == 8e8 // 8.008e6 == 99
    assert not a["disk"]["here"]["fits"] and a["problems"] == ["needs 1.0 GB here, more than its 1.0 GB"]
    assert b["feasible"] and plan["recommendation"] == "B"
    assert b["budget"] == {"usd": "over", "hours": "inside"}
    # a = 4000 / 5e8 x 12/3600 + 6 / 3600 / 2e4 (the remote's speed to there: the link's); b = 12/3600 / 1e5;
    # F_B - F_A = B's engine start, 60 x 12/3600.
    per_a, per_b = 4000 / 5e8 * 12 / 3600 + 6 / 3600 / 2e4, 12 / 3600 / 1e5
    fixed = 60 * 12 / 3600
    assert plan["break_even_a_vs_b"]["tokens"] == pytest.approx(fixed / (per_a - per_b))
    assert plan["break_even_a_vs_b"]["samples"] == pytest.approx(fixed / (per_a - per_b) / 1000)
    assert plan["answer"][2].startswith(
        "Extract on the rented machine (B): 36 min rented, $7.26 (ship 400.0 MB through the DVC remote at 4.00 "
        "Gbit/s (A) is ruled out: needs 1.0 GB here, more than its 1.0 GB; stream there (C): 36 min, $7.26); between "
        "A and B, shipping is cheaper below"
    )
    assert plan["answer"][3] == (
        "Budget (B, training included): $7.26 is over the budget of $0.5; 0.6 h is inside 0.01-1 h."
    )


def test_disk_limits_rule_layouts_out_down_to_streaming(tmp_path):
    _metrics(tmp_path)
    # A and B need 3.04 TB there (the weights, to evaluate there, and the states): on a 2.5 TB rented disk only
    # streaming remains.
    small = _plan(tmp_path, *SEED, "--disk-tb", "2.5")
    assert small["recommendation"] == "C" and not small["scenarios"]["B"]["feasible"]
    assert small["scenarios"]["B"]["problems"] == ["needs 3.04 TB there, more than its 2.50 TB"]
    assert small["answer"][0].startswith("Recommended: layout C (stream the hidden states on the rented machine")
    assert "extract there (B) is ruled out: needs 3.04 TB there" in small["answer"][2]
    # (2.5e12 / 1.2 - 600e9 - checkpoints) / ((57,344 / 1.476 + 4) x 16,384) = 2,263 samples would fit B.
    fixed = 600e9 + CHECKPOINTS
    assert small["scenarios"]["B"]["disk"]["there"]["largest_samples"] == int(
        (2.5e12 / 1.2 - fixed) // ((57_344 / 1.476 + 4) * 16_384)
    )
    # On a 1 TB rented disk too (822 GB: weights, text, checkpoints and its 64 GB buffer).
    tiny = _plan(tmp_path, *SEED, "--disk-tb", "1")
    assert tiny["scenarios"]["C"]["feasible"] and tiny["recommendation"] == "C"
    assert tiny["answer"][2].startswith(
        "Stream the hidden states on the rented machine, storing none (C, train.hidden_states: streamed): 2.5 h "
        "rented, $101 (ship 1.91 TB through the DVC remote at 4.00 Gbit/s (A) is ruled out: needs 3.04 TB there, more "
        "than its 1.00 TB; extract there (B) is ruled out: needs 3.04 TB there, more than its 1.00 TB)"
    )
    # With a buffer that does not fit either, nothing does, and the answer says how many samples would.
    none = _plan(tmp_path, *SEED, "--disk-tb", "1", "--stream-buffer-gb", "300")
    assert none["recommendation"] is None
    assert none["answer"][0] == "Recommended: no layout: none works with these inputs (below)."
    assert none["answer"][2].startswith("No layout works with these inputs: A: needs 3.04 TB there")
    assert "C: needs 1.11 TB there, more than its 1.00 TB (at most 0 samples" in none["answer"][2]
    assert "samples of this length fit there" in none["answer"][2]
    # At 400 Gbit/s shipping a token's states is cheaper than extracting it there: no break-even, A wins.
    fast = _plan(tmp_path, *SEED, "--link-gbit", "400")
    assert fast["break_even_a_vs_b"]["tokens"] is None and fast["recommendation"] == "A"
    assert "shipping is cheaper at any size" in fast["answer"][2]
    # A copying cache doubles the states here: 3.82 TB + text does not fit the 3 TB volume.
    copied = _plan(tmp_path, *SEED, "--cache-link", "copy")
    assert copied["scenarios"]["A"]["disk"]["here"]["bytes"] == pytest.approx((STORED + TEXT) * 2 * 1.2)
    assert not copied["scenarios"]["A"]["disk"]["here"]["fits"] and copied["recommendation"] == "B"


def test_gpu_presets_and_weights_that_do_not_fit_gpu_memory(tmp_path):
    _metrics(tmp_path)
    b300 = _plan(tmp_path, *SEED, "--gpu", "b300")
    assert b300["rates"]["machine_usd_per_hour"] == 8 * 6.5
    assert b300["rates"]["extract_there_tokens_per_s"] == pytest.approx(EXTRACT_B200)  # same dense bf16 FLOP/s
    # 600 GB of weights > 8 x 80 GB x 0.9: every layout serves the verifier there to evaluate, so none runs on
    # eight H100s.
    h100 = _plan(tmp_path, *SEED, "--gpu", "h100", "--gpu-usd-per-hour", "2")
    problem = "the verifier's 600 GB of weights do not fit 8 x 80 GB x 0.9 of GPU memory there"
    assert all(h100["scenarios"][key]["problems"] == [problem] for key in "ABC")
    assert h100["recommendation"] is None and h100["rates"]["machine_usd_per_hour"] == 16
    assert h100["rates"]["train_tokens_per_s"] == pytest.approx(8 * 7134)
    assert any("do not fit there (8 x 80 GB x 0.9)" in w for w in h100["warnings"])
    long = _plan(tmp_path, "--samples", "3000", "--mean-tokens", "65536", "--gpu", "h200")
    assert any("train.activation_checkpointing" in w for w in long["warnings"])
    short = _plan(tmp_path, "--samples", "3000", "--mean-tokens", "2048", "--gpu", "h200")
    assert not any("train.activation_checkpointing" in w for w in short["warnings"])


def test_measured_rates_only_from_the_same_verifier(tmp_path):
    model = tmp_path / "verifier-config"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps({"_name_or_path": "org/small", "hidden_size": 576, "num_hidden_layers": 30, "vocab_size": 49152})
    )
    (model / "model.safetensors").write_bytes(b"\0" * 1000)
    args = ("--verifier", str(model), "--samples", "10", "--mean-tokens", "100", "--active-params", "1.35e8")
    _metrics(tmp_path, ratio=1.5, tokens_per_s=2000)
    _provenance(tmp_path, "org/small")
    same = _plan(tmp_path, *args)
    assert same["rates"]["extract_here_tokens_per_s"] == 2000
    assert (
        same["inputs"]["sources"]["extract_here"]
        == "metrics/extract.json this_run.tokens_per_s, measured here on org/small"
    )
    assert same["hidden_states"]["stored_bytes"] == pytest.approx(10 * 100 * 4 * 576 * 2 / 1.5)
    assert not any("compression ratio" in w for w in same["warnings"])

    _provenance(tmp_path, "org/other")
    other = _plan(tmp_path, *args, "--here-share", "0.5")
    flops = 2 * 1.35e8 + 2 * 30 * 100 * 576
    assert other["rates"]["extract_here_tokens_per_s"] == pytest.approx(8 * 836e12 * 0.3 * 0.5 / flops)
    assert "the measured rate is org/other's" in other["inputs"]["sources"]["extract_here"]
    assert any(
        "compression ratio 1.5 was measured on org/other's states, not org/small's" in w for w in other["warnings"]
    )
    # An explicit ratio wins over the file and needs no warning.
    explicit = _plan(tmp_path, *args, "--compression-ratio", "2")
    assert explicit["hidden_states"]["stored_bytes"] == 10 * 100 * 4 * 576 * 2 / 2
    assert not any("compression ratio" in w for w in explicit["warnings"])


def test_cache_link_from_the_projects_dvc_config(tmp_path):
    _metrics(tmp_path)
    (tmp_path / ".dvc").mkdir()
    (tmp_path / ".dvc" / "config").write_text("[cache]\n    type = hardlink,symlink\n")
    (tmp_path / ".dvc" / "config.local").write_text("[cache]\n    type = copy\n")
    plan = _plan(tmp_path, *SEED)
    assert plan["inputs"]["cache_link"] == "copy" and "DVC config" in plan["inputs"]["sources"]["cache_link"]
    assert not any("cache.type" in w for w in plan["warnings"])
    (tmp_path / ".dvc" / "config.local").unlink()
    assert _plan(tmp_path, *SEED)["inputs"]["cache_link"] == "hardlink"


def test_cache_link_follows_outputs_on_another_filesystem(tmp_path):
    """A hardlink cannot reach an output on another volume than the cache: DVC then takes the next type it is
    given (symlink: no second copy), or copies."""
    _metrics(tmp_path)
    (tmp_path / ".dvc").mkdir()
    with tmpfs(tmp_path / "volume", "1m") as volume:
        (volume / "hidden").mkdir()
        (tmp_path / "data").mkdir()
        (tmp_path / "data" / "hidden").symlink_to(volume / "hidden")
        expected_disk = {}
        for types, link in (("hardlink,symlink", "symlink"), ("hardlink", "copy"), ("symlink,copy", "symlink")):
            (tmp_path / ".dvc" / "config").write_text(f"[cache]\n    type = {types}\n")
            plan = _plan(tmp_path, *SEED)
            assert plan["inputs"]["cache_link"] == link, types
            assert (
                "data/hidden and the DVC cache are on different filesystems" in plan["inputs"]["sources"]["cache_link"]
            ) == types.startswith("hardlink")
            expected_disk[link] = plan["scenarios"]["B"]["disk"]["there"]["bytes"]
        # Copies store the states, answers and checkpoints twice (B there also holds the verifier's weights, once).
        weights = plan["verifier_weights_bytes"] * (1 + plan["inputs"]["headroom"])
        assert expected_disk["copy"] - weights == pytest.approx(2 * (expected_disk["symlink"] - weights))


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--samples", "0", "--mean-tokens", "16384"), "--samples must be > 0, got 0"),
        (("--samples", "3000", "--mean-tokens", "-5"), "--mean-tokens must be > 0, got -5"),
        ((*SEED, "--layers", "0"), "--layers must be > 0, got 0"),
        ((*SEED, "--link-gbit", "-1"), "--link-gbit must be > 0, got -1"),
        ((*SEED, "--disk-tb", "-3"), "--disk-tb must be > 0, got -3"),
        ((*SEED, "--here-disk-tb", "0"), "--here-disk-tb must be > 0, got 0"),
        # Past any machine: a figure that would overflow, or an estimate that would not finish.
        ((*SEED, "--disk-tb", "1e308"), "--disk-tb must be <= 1e+06, got 1e+308"),
        ((*SEED, "--ttt-steps", "100000"), "--ttt-steps must be <= 32, got 100000"),
        ((*SEED, "--mean-tokens", "nan"), "--mean-tokens must be > 0, got nan"),
        (
            (*SEED, "--max-tokens", "100"),
            "--mean-tokens (16384) cannot exceed the longest sample, 100 tokens (--max-tokens)",
        ),
        ((*SEED, "--link-efficiency", "1.5"), "--link-efficiency is a fraction in (0, 1], got 1.5"),
        ((*SEED, "--here-share", "2"), "--here-share is a fraction in (0, 1], got 2"),
        ((*SEED, "--compression-ratio", "1"), "--compression-ratio is raw/stored and must be > 1"),
        ((*SEED, "--gpu", "a100"), "--gpu: unknown GPU 'a100'; presets: b300, b200, h200, h100, h200-nvl"),
        ((*SEED, "--here-gpu", "x"), "--here-gpu: unknown GPU 'x'"),
        ((*SEED, "--cache-link", "move"), "--cache-link: unknown link type 'move'; one of hardlink"),
        (
            (*SEED, "--budget-usd", "900-180"),
            "--budget-usd: expected MAX or MIN-MAX with 0 < MIN <= MAX, got '900-180'",
        ),
        ((*SEED, "--budget-hours", "soon"), "--budget-hours: expected MAX or MIN-MAX"),
        (
            (*SEED, "--verifier", "kimi-k9"),
            "unknown verifier 'kimi-k9': not a preset (kimi-k2.5) and no such config.json",
        ),
        (SEED, "metrics/extract.json not found"),
    ],
)
def test_bad_input_is_one_line(tmp_path, args, expected):
    assert expected in _error(tmp_path, *args)


def _dvc_project(root: Path, *remote: str) -> None:
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run([DVC, "init", "-q"], cwd=root, check=True)
    subprocess.run([DVC, "remote", "add", *remote], cwd=root, check=True)


@pytest.mark.parametrize("url", ["s3://bucket/path", "ssh://root@127.0.0.1:{port}/srv/dvc"])
def test_unreachable_remote_is_one_line(tmp_path, url):
    from servers import free_port

    port = free_port()  # nothing listens there
    _dvc_project(tmp_path, "far", url.format(port=port))
    if url.startswith("s3"):
        subprocess.run(
            [DVC, "remote", "modify", "far", "endpointurl", f"http://127.0.0.1:{port}"], cwd=tmp_path, check=True
        )
    line = _error(tmp_path, *SEED, "--compression-ratio", "1.5", "--link-from-remote", "far")
    assert f"remote 'far' ({url.format(port=port)}) unreachable: 127.0.0.1:{port}: Connection refused" in line
    assert "no such DVC remote (far)" in _error(
        tmp_path, *SEED, "--compression-ratio", "1.5", "--link-from-remote", "near"
    )


@pytest.mark.slow
def test_link_measured_on_a_real_s3_server(tmp_path):
    from servers import S3_KEY_ID, S3_SECRET, MotoS3

    server = MotoS3(tmp_path / "moto").start()
    try:
        _dvc_project(tmp_path, "-d", "s3", f"s3://{MotoS3.bucket}/eagle3")
        for setting in (
            ["endpointurl", server.endpoint],
            ["--local", "access_key_id", S3_KEY_ID],
            ["--local", "secret_access_key", S3_SECRET],
        ):
            local = setting[:1] if setting[0] == "--local" else []
            subprocess.run([DVC, "remote", "modify", *local, "s3", *setting[len(local) :]], cwd=tmp_path, check=True)
        plan = _plan(
            tmp_path, *SEED, "--compression-ratio", "1.5", "--link-from-remote", "s3", "--probe-mb", "8", "--jobs", "4"
        )
        measured = plan["inputs"]["link_measurement"]
        assert measured["jobs"] == 4 and measured["single_gbit"] > 0 and measured["parallel_gbit"] > 0
        assert plan["inputs"]["link_efficiency"] == 1.0 and plan["inputs"]["link_gbit"] == measured["parallel_gbit"]
        assert plan["inputs"]["sources"]["link"].startswith("measured: 8 MB to DVC remote 's3', one stream ")
        assert ", 4 streams " in plan["inputs"]["sources"]["link"]
        assert plan["rates"]["link_bytes_per_s"] == pytest.approx(measured["parallel_gbit"] * 1e9 / 8)
        assert server.object_count() == 0  # the probe is deleted
    finally:
        server.kill()


def test_verifier_dir_without_index_sums_its_safetensors(tmp_path):
    model = tmp_path / "dense"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"hidden_size": 576, "num_hidden_layers": 30, "vocab_size": 49152}))
    args = (
        "--verifier",
        str(model),
        "--samples",
        "10",
        "--mean-tokens",
        "100",
        "--compression-ratio",
        "1.5",
        "--extract-tokens-per-s",
        "1000",
        "--here-tokens-per-s",
        "1000",
    )
    assert "weights size unknown (no safetensors beside its config.json): pass --weights-gb" in _error(tmp_path, *args)
    (model / "model-00001.safetensors").write_bytes(b"\0" * 12_345)
    (model / "model-00002.safetensors").write_bytes(b"\0" * 655)
    plan = _plan(tmp_path, *args)
    assert plan["verifier_weights_bytes"] == 13_000 and plan["bytes_per_token"] == 4 * 576 * 2
    # No heads in the config: 6 of 96 assumed (the largest even size up to 128 that divides 576); fc, q/k/v from 2H,
    # o, the MLP (intermediate defaults to 4 x hidden), the head and 7 norms.
    h = 576
    assert plan["draft_params"] == 3 * h * h + 3 * 2 * h * h + h * h + 3 * h * 4 * h + 32000 * h + 7 * h


def test_a_metrics_file_with_a_figure_no_run_measures_is_one_line(tmp_path):
    _metrics(tmp_path, ratio=float("nan"))
    line = _error(tmp_path, *SEED)
    assert line == (
        f"eagle3 plan: error: {tmp_path}/metrics/extract.json: not the extract stage's metrics (NaN is not a number a "
        "figure may be); rerun the extract stage or pass --compression-ratio"
    )


def test_a_block_draft_is_sized_and_priced_as_the_trainer_builds_it():
    """Kimi-K2.5's DFlash draft as published (6 layers, full vocabulary): the plan counts the trainer's draft, by the
    hand count of its tensors, and prices the block draft's own training step, not an EAGLE-3 one."""
    from eagle3.params.train import TrainParams, draft_settings
    from eagle3.plan.facts import KIMI_K2_5_TEXT_CONFIG
    from eagle3.plan.memory import draft_figures, estimate

    vocab, hidden, mlp = 163_840, 7_168, KIMI_K2_5_TEXT_CONFIG["intermediate_size"]
    train = TrainParams(draft_method="dflash", dflash={"layers": 6, "block_size": 16})
    figures = draft_figures(KIMI_K2_5_TEXT_CONFIG, vocab, draft_settings(train))
    heads = hidden // 128  # an MLA verifier's block draft: heads of 128, as many KV heads
    layer = 4 * hidden * heads * 128 + 2 * 128 + 2 * hidden + 3 * hidden * mlp
    assert figures.parameters == 3 * hidden * hidden + hidden + 6 * layer + hidden + vocab * hidden
    chain = draft_figures(KIMI_K2_5_TEXT_CONFIG, vocab, draft_settings(TrainParams()))
    assert chain.parameters != figures.parameters
    memory = estimate(KIMI_K2_5_TEXT_CONFIG, vocab, 7, 8, "ddp", draft_settings(train))
    assert memory.ttt_steps == 15 and list(memory.lines or {}) == ["off"], memory
    assert "a DFlash draft of 6 layers, blocks of 16 at 64 anchors per sample" in memory.source
    line = memory.lines["off"]
    # Between steps: fp32 weights, DDP's gradient copy, Muon's and AdamW's state, at least 3 x 4 bytes a parameter.
    assert line.fixed_bytes > 12 * figures.parameters and line.bytes_per_token > 0
    chain_memory = estimate(KIMI_K2_5_TEXT_CONFIG, vocab, 7, 8, "ddp", draft_settings(TrainParams()))
    assert chain_memory.lines is not None and chain_memory.lines["off"] != line


def test_training_flops_per_token_are_the_hand_count_of_each_draft_s_step():
    """What the plan scales the measured chain-draft rate by for a block draft: 2 x 3 FLOPs per trained weight a
    token passes through, 2 per verifier head row; a block draft's blocks amortised over the sample's tokens."""
    import torch

    from eagle3.modeling.drafts import draft_for
    from eagle3.params.train import TrainParams
    from eagle3.plan.memory import training_matmul_flops
    from eagle3.training.memory import draft_config_for

    verifier = {
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 128,
        "num_hidden_layers": 8,
        "vocab_size": 100,
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-5,
    }
    block = TrainParams(draft_method="dflash", dflash={"layers": 2, "block_size": 4})
    with torch.device("meta"):
        chain_draft = draft_for(draft_config_for(verifier, 50))
        block_draft = draft_for(draft_config_for(verifier, 50, block))
    fc, head = 3 * 64 * 64, 50 * 64
    mlp = 3 * 64 * 128
    # The chain draft's layer reads [embedding; feature] (2 x 64) into 4 x 16 queries and 2 x 16 keys and values.
    chain_layer = 128 * 64 + 2 * 128 * 32 + 64 * 64 + mlp
    assert training_matmul_flops(chain_draft, 3, 0, 60) == 6 * (fc + 3 * (chain_layer + head)) + 2 * head
    block_layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + mlp
    context = fc + 2 * (2 * 64 * 32)  # fc, then each layer's keys and values of every token
    blocks = 6 * (4 * 2 * block_layer + 3 * head)  # 6 anchors of 4 queries through 2 layers, head on 3 slots
    assert training_matmul_flops(block_draft, 0, 6, 60) == pytest.approx(6 * (context + blocks / 60) + 2 * head)
    # Fewer tokens than anchors: one block per token at most.
    assert training_matmul_flops(block_draft, 0, 600, 60) == training_matmul_flops(block_draft, 0, 60, 60)
