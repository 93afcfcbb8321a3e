"""extract.backend vllm where a prompt is longer than an engine step: the capture
(eagle3/engines/hidden_states/vllm_capture.py) against the transformers forward, position by position."""

import json
import re
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


def _capture(model_dir: Path, ids: dict[str, torch.Tensor], scratch: Path, *options: str) -> tuple[dict, dict]:
    """tests/vllm_capture_run.py in its own process (a vLLM engine per run): the states, and its record (the
    stage's refusals, the asynchronous writes, what the spool kept)."""
    save_file(ids, scratch / "sequences.safetensors")
    out = scratch / "captured.safetensors"
    command = [
        sys.executable,
        str(REPO / "tests/vllm_capture_run.py"),
        str(model_dir),
        str(scratch / "sequences.safetensors"),
    ]
    # A scheduler that can never fit a prompt, or a capture waiting on a lock only an engine step releases, waits
    # forever: the bound turns that into a failure.
    subprocess.run([*command, str(out), *options], check=True, cwd=scratch, timeout=300)
    return load_file(out), json.loads(out.with_suffix(".json").read_text())


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
    chunked, record = _capture(model, ids, tmp_path, *layer_args, "--step-tokens", str(step))
    assert record["refusals"] == [
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


def test_the_capture_waits_out_vllm_s_cuda_connector_protocol(verifier_project, tmp_path):
    """vLLM's connector on the path it takes on CUDA (tests/cuda_connector_on_cpu.py: locks held from scheduling,
    saves handed over one engine step after the requests finish, writer threads): with whole prefills every request
    of a batch finishes in the same step, so when `generate` returns every file is still locked, and a capture
    that waited on a lock without stepping the engine would wait forever (the subprocess's bound fails it)."""
    layers = [2, 15, 27, 30]
    lengths = {"first": 90, "second": 40, "third": 65}
    model = verifier_project / "models/verifier"
    ids = _random_ids(json.loads((model / "config.json").read_text())["vocab_size"], lengths)
    states, record = _capture(model, ids, tmp_path, "--layers", *map(str, layers), "--cuda-connector-path")
    # Every file went through vLLM's asynchronous save and writer thread, and was read and removed with its lock.
    assert record["writes"] == {"submitted": 3, "written": 3}
    assert record["spool_left"] == []
    hf = HfHiddenStates(model, False, tuple(layers), "float32")
    sequences = [Sequence(n, t, torch.ones_like(t, dtype=torch.bool), False) for n, t in ids.items()]
    for sequence, expected in zip(sequences, hf.forward(sequences), strict=True):
        assert _token_errors(states[sequence.sample_id], expected).max() < STORAGE_ROUNDING, sequence.sample_id


def test_a_stuck_connector_write_ends_the_capture_with_one_line(verifier_project, tmp_path):
    """The same protocol with every writer thread stuck before writing (a hung disk): the capture gives up after its
    bound with one line naming the files and what vLLM was doing, instead of waiting forever."""
    model = verifier_project / "models/verifier"
    ids = _random_ids(json.loads((model / "config.json").read_text())["vocab_size"], {"only": 30})
    _, record = _capture(
        model, ids, tmp_path, "--layers", "2", "30", "--cuda-connector-path", "--writers-stall", "--save-timeout", "2"
    )
    assert record["writes"] == {"submitted": 1, "written": 0}
    assert re.fullmatch(
        re.escape(f"extract.backend vllm: {tmp_path}/spool/0-")
        + r"\w+\.safetensors not written 2 s after generate returned \(1 still locked "
        r"by vLLM's connector, 0 neither written nor locked; \d+ engine steps taken since, unfinished requests: "
        r"False\); vLLM's log says what its writer threads did: check the spool directory's disk, then rerun "
        r"\(finished shards are kept\)",
        record["error"],
    ), record["error"]


def test_an_mla_verifier_extracts_prompts_longer_than_the_cpu_step_default(tmp_path):
    """vLLM-CPU turns chunked prefill off for MLA after sizing the scheduler's per-step budget (4,096 tokens), so a
    longer prompt was never scheduled. The stage's own settings, on the Kimi-shaped miniature (MLA + MoE)."""
    model = build(tmp_path / "miniature", REPO)
    layers = [1, 3, 4, 6]
    ids = _random_ids(json.loads((model / "config.json").read_text())["vocab_size"], {"long": 4500, "short": 40})
    dtype = resolve("auto", "cpu")  # what the stage computes in on this CPU
    states, record = _capture(
        model, ids, tmp_path, "--layers", *map(str, layers), "--dtype", dtype, "--trust-remote-code"
    )
    assert record["refusals"] == []
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
    states, record = _capture(
        model, ids, tmp_path, "--layers", *map(str, layers), "--dtype", "bfloat16", "--trust-remote-code"
    )
    assert record["refusals"] == []
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
