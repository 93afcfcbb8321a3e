"""Layout C: the verifier's share of each GPU holds its capture engine's step (eagle3/plan/gpu_fit.py), and the
streamed capture's engine is started with a step of one sequence (eagle3/engines/hidden_states/vllm_capture.py)."""

from types import SimpleNamespace

import pytest

from eagle3.engines.hidden_states.base import CaptureRequest
from eagle3.params.extract import ExtractParams
from eagle3.plan.facts import GB, KIMI_K2_5_TEXT_CONFIG
from eagle3.plan.gpu_fit import kv_bytes_per_token, verifier_share, verifier_workspace_bytes

KIMI_WEIGHTS = 600 * GB
# The Kimi-K2.5 configuration: aux layers (2, 30, 58) and the final layer; 20,480-token sequences.
CAPTURED, STEP = 4, 20_481


def test_the_workspace_at_kimi_k2_5_s_shape_on_h200():
    # MLA's latent (512 + 64 per layer, whole on every GPU) and the four captured layers' states, bf16.
    assert kv_bytes_per_token(KIMI_K2_5_TEXT_CONFIG, CAPTURED, 8) == 2 * (61 * 576 + 4 * 7168) == 127_616
    workspace = verifier_workspace_bytes(KIMI_K2_5_TEXT_CONFIG, CAPTURED, 8, STEP)
    # 3 copies of the step's states (3.52 GB), KV for two sequences (5.23), activations (2.46), fixed (3).
    assert workspace == pytest.approx(3 * STEP * 4 * 7168 * 2 + 2 * STEP * 127_616 + 120_000 * STEP + 3e9)
    assert workspace / GB == pytest.approx(14.21, abs=0.01)
    # 75 GB of weights per GPU + 14.2 GB: 63.3% of an H200's 141 GB, rounded up.
    assert verifier_share(KIMI_WEIGHTS, 8, "h200", KIMI_K2_5_TEXT_CONFIG, CAPTURED, STEP) == 0.64
    # The step extract itself takes (65,536 tokens, its batch_tokens) would not fit that share's 15.2 GB.
    uncapped = verifier_workspace_bytes(KIMI_K2_5_TEXT_CONFIG, CAPTURED, 8, 65_536)
    assert uncapped / GB == pytest.approx(38.87, abs=0.01) and 0.64 * 141 * GB - 75 * GB < uncapped


def test_a_gqa_verifier_s_kv_is_split_over_its_gpus():
    llama = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8}
    # 8 KV heads x 128 over 2 GPUs: 4 heads each, keys and values; the captured states whole on each.
    assert kv_bytes_per_token(llama, 4, 2) == 2 * (32 * 2 * 4 * 128 + 4 * 4096)
    assert kv_bytes_per_token(llama, 4, 16) == 2 * (32 * 2 * 1 * 128 + 4 * 4096)


@pytest.mark.parametrize(("step_tokens", "expected"), [(None, 65_536), (20_481, 20_481)])
def test_the_capture_engine_takes_the_request_s_step(monkeypatch, tmp_path, step_tokens, expected):
    from transformers import LlamaConfig, LlamaForCausalLM

    from eagle3.engines.hidden_states import vllm_capture

    LlamaForCausalLM(
        LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_hidden_layers=2, vocab_size=64)
    ).save_pretrained(tmp_path / "verifier")
    started = {}

    class Started(Exception):
        pass

    def start_engine(vllm, who, model_dir, **arguments):
        started.update(arguments)
        raise Started

    monkeypatch.setattr(vllm_capture, "start_engine", start_engine)
    request = CaptureRequest(
        tmp_path / "verifier",
        SimpleNamespace(num_hidden_layers=2, trust_remote_code=False),
        (1, 2),
        ExtractParams(backend="vllm", max_seq_len=20_480, batch_tokens=65_536),
        tmp_path / "spool",
        "float32",
        step_tokens=step_tokens,
    )
    with pytest.raises(Started):
        vllm_capture.VllmHiddenStates(request)
    assert started["enable_chunked_prefill"] is False and started["max_num_batched_tokens"] == expected
