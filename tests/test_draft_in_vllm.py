"""The exported draft as vLLM runs it: for every draft layout and both export formats, vLLM-CPU's EAGLE-3 proposer
(llama_eagle3.py, fed by a real verifier's captured states) proposes the tokens the project's own forward proposes
from the same inputs; and so does its MLA draft (deepseek_eagle3.py) behind an MLA verifier, with MLA on. (vLLM-CPU
cannot put an MLA draft behind a Llama-style verifier: its MLA backend takes only KV blocks of 16 and its other
attention only multiples of 32, "No common block size"; on GPUs vLLM's backends share a block size.)

The draft is untrained (random weights, norms away from one), so nothing but the arithmetic makes the proposals
agree; each verification step's later proposals follow the draft's own earlier ones (free-running, as vLLM drafts),
which is where norm_output and the draft's own KV entries matter."""

import json
import os
import subprocess
import sys

import pytest
import torch
from drafts import export_every_other_token
from kimi_miniature import build
from safetensors.torch import load_file
from torch import nn

from eagle3.formats.hf_config import read_config
from eagle3.formats.hf_weights import load_verifier_tensors
from eagle3.modeling.draft import DraftConfig, Eagle3Draft
from eagle3.params.train import DraftLayer, DraftLayout, DraftMLA

from conftest import REPO

pytestmark = pytest.mark.slow

VERIFIER = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "intermediate_size": 256,
    "num_hidden_layers": 8,
    "vocab_size": 256,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}
# A DeepSeek-V3 verifier (MLA, dense layers): kv_lora_rank + qk_rope_head_dim = 576, the one MLA head size
# vLLM-CPU runs; its draft's MLA shape is derived from it (DraftMLA).
MLA_VERIFIER = {
    **{key: value for key, value in VERIFIER.items() if key != "head_dim"},
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "num_key_value_heads": 2,
    "q_lora_rank": None,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 32,
    "v_head_dim": 32,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 8,
}
AUX = (2, 4, 5)
K = 3
PROMPTS = [[(7 * i + 3) % 256 for i in range(12)], [(11 * i + 5) % 256 for i in range(23)]]
LAYOUTS = {
    "2024": DraftLayout(),
    "eagle3.1": DraftLayout(fc_norm=True, norm_output=True),
    "speculators": DraftLayout(norm_before_fc=True, norm_output=True, norm_before_residual=True),
}


def _save_verifier(directory, config: dict):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config)).eval()
    model.save_pretrained(directory)
    return directory, model.model.embed_tokens.weight.detach().clone()


@pytest.fixture(scope="module")
def verifier(tmp_path_factory):
    return _save_verifier(tmp_path_factory.mktemp("verifier"), VERIFIER)


@pytest.fixture(scope="module")
def mla_verifier(tmp_path_factory):
    return _save_verifier(tmp_path_factory.mktemp("mla-verifier"), MLA_VERIFIER)


@pytest.fixture(scope="module")
def kimi_miniature(tmp_path_factory):
    """The Kimi-shaped miniature (tests/kimi_miniature.py: MLA, MoE, YaRN), its embedding and config."""
    directory = build(tmp_path_factory.mktemp("kimi") / "miniature", REPO)
    return (directory, load_verifier_tensors(directory)["embed"]), read_config(directory)


def _draft(layout: DraftLayout, verifier_config: dict = VERIFIER, layer: DraftLayer = "llama") -> Eagle3Draft:
    # Half the verifier's vocabulary (every other token: _compare_with_vllm's d2t); the MLA draft's query rank set
    # small (derived, it would be 3 x 512 for these small models).
    shape = DraftConfig.from_verifier(
        verifier_config,
        AUX,
        draft_vocab_size=verifier_config["vocab_size"] // 2,
        layout=layout,
        layer=layer,
        mla=DraftMLA(q_lora_rank=64),
    )
    draft = Eagle3Draft(shape)
    generator = torch.Generator().manual_seed(1)
    draft.init_weights(generator)
    with torch.no_grad():
        for module in draft.modules():
            if hasattr(module, "eps"):
                module.weight.copy_(1 + 0.3 * torch.randn(module.weight.shape, generator=generator))
        # Big enough that the draft's own arithmetic, not noise, picks the argmax.
        draft.lm_head.weight.mul_(50)
    return draft.eval()


def _calls(directory) -> list[list[dict[str, torch.Tensor]]]:
    """The recorded proposer calls, per prompt."""
    prompts, current = [], []
    for path in sorted(directory.glob("call-*.safetensors")):
        call = load_file(path)
        if "end_of_prompt" in call:
            prompts.append(current)
            current = []
        else:
            current.append(call)
    return prompts


def _our_proposals(draft, embed, d2t, tokens: list[int], aux: torch.Tensor) -> list[int]:
    """K proposals after the verified `tokens` (the last one sampled after aux's last position), each step fed the
    draft's own previous proposal, as vLLM drafts."""
    proposals: list[int] = []
    last = aux.shape[0] - 1
    for step in range(K):
        ids = torch.tensor([tokens + proposals])
        padded = torch.cat([aux, aux.new_zeros(ids.shape[1] - aux.shape[0], aux.shape[1])])[None]
        with torch.no_grad():
            features = draft.unroll(ids, padded, embed, step + 1)
            chosen = int(draft.logits(features[step][0, last]).argmax())
        proposals.append(chosen + int(d2t[chosen]))
    return proposals


def _compare_with_vllm(
    tmp_path,
    verifier,
    layout: DraftLayout,
    export_format: str,
    runner: str,
    draft: Eagle3Draft | None = None,
    fake_amx: bool = False,
) -> None:
    """Export a draft (by default the Llama-style layer for VERIFIER), run it in vLLM with model runner `runner`
    (tests/vllm_proposals.py's last argument; `fake_amx`: as on a CPU with AMX tiles) and check that every recorded
    proposal is the one the project's own forward makes from the same inputs."""
    verifier_dir, embedding = verifier
    draft = draft or _draft(layout)
    d2t, _ = export_every_other_token(
        draft,
        tmp_path,
        embedding.shape[0],
        dtype="float32",
        k=K,
        verifier_name="tiny/verifier",
        architectures=VERIFIER["architectures"],
    )
    result = subprocess.run(
        [sys.executable, str(REPO / "tests/vllm_proposals.py"), str(verifier_dir), str(tmp_path / export_format),
         str(tmp_path / "calls"), str(K), json.dumps(PROMPTS), runner],
        capture_output=True, text=True, timeout=900, env={**os.environ, "FAKE_AMX": "1" if fake_amx else "0"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    embed = nn.Embedding.from_pretrained(embedding)
    compared = agreed = chained = 0
    for calls in _calls(tmp_path / "calls"):
        tokens: dict[int, int] = {}
        states: dict[int, torch.Tensor] = {}
        for call in calls:
            positions = call["target_positions"].tolist()
            for index, position in enumerate(positions):
                tokens[position] = int(call["target_token_ids"][index])
                states[position] = call["target_hidden_states"][index]
            sampled = call.get("token_indices_to_sample")
            last = positions[int(sampled[0]) if sampled is not None else len(positions) - 1]
            verified = [tokens[p] for p in range(last + 1)] + [int(call["next_token_ids"][0])]
            aux = torch.stack([states[p] for p in range(last + 1)])
            ours = _our_proposals(draft, embed, d2t, verified, aux)
            theirs = call["drafts"][0].tolist()
            compared += len(ours)
            agreed += sum(a == b for a, b in zip(ours, theirs, strict=True))
            chained += ours[1:] == theirs[1:]
    # At least one call per generated token for every prompt, three proposals each; the random draft accepts
    # little, so most steps draft three new tokens.
    assert compared >= 3 * 40 * len(PROMPTS) * 0.9, compared
    # float32 on both sides: anything but a near-tie of two logits agrees.
    assert agreed >= 0.98 * compared, (agreed, compared)
    assert chained >= 0.95 * compared / 3, (chained, compared)


@pytest.mark.parametrize("export_format", ["draft", "speculators"])
@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_vllm_proposes_what_the_drafts_own_forward_proposes(tmp_path, verifier, layout, export_format):
    # Model Runner V1, what vLLM-CPU runs (and, asked for, what a CUDA build runs too).
    _compare_with_vllm(tmp_path, verifier, layout, export_format, "v1")


MLA_LAYOUTS = {
    "eagle3.1": DraftLayout(fc_norm=True, norm_output=True),
    "norm_before_residual": DraftLayout(norm_before_residual=True),
}


@pytest.mark.parametrize("layout", MLA_LAYOUTS.values(), ids=MLA_LAYOUTS.keys())
def test_vllm_proposes_what_the_mla_drafts_own_forward_proposes(tmp_path, mla_verifier, layout):
    # The vLLM format only: vLLM's speculators loader has no MLA layer (eagle3/formats/exported_draft.py).
    # As vLLM-CPU runs on a CPU with AMX tiles, whatever this one has: there it would put every MLA layer on its AMX
    # backend, which refuses float32 weights, unless the engine set-up pins the reference backend for the verifier
    # and the draft (eagle3/engines/vllm_env.py, cpu_mla_backends). In float32 no AMX kernel runs, so any x86 CPU
    # can run this, and the float32 comparison stays exact.
    draft = _draft(layout, MLA_VERIFIER, "mla")
    assert draft.config.kv_lora_rank + draft.config.qk_rope_head_dim == 576
    _compare_with_vllm(tmp_path, mla_verifier, layout, "draft", "v1", draft, fake_amx=True)


def test_vllm_proposes_what_the_mla_drafts_own_forward_proposes_behind_the_kimi_miniature(tmp_path, kimi_miniature):
    """Behind Kimi-K2.5's architecture (MoE, YaRN verifier), with MLA on for both: an MLA draft needs no
    VLLM_MLA_DISABLE on CPU, and must not have it (the verifier would then leave the MLA backend, and vLLM-CPU
    finds no KV block size for the two). The draft takes the verifier's YaRN, which vLLM computes as DeepSeek's."""
    verifier, config = kimi_miniature
    draft = _draft(MLA_LAYOUTS["eagle3.1"], config, "mla")
    assert (draft.config.kv_lora_rank, draft.config.qk_rope_head_dim) == (512, 64)
    assert draft.config.rope["rope_parameters"]["rope_type"] == "yarn"
    assert draft.config.rope["rope_parameters"]["factor"] > 1
    _compare_with_vllm(tmp_path, verifier, MLA_LAYOUTS["eagle3.1"], "draft", "v1", draft, fake_amx=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (make gpu-check)")
def test_vllm_v2_runner_proposes_what_the_drafts_own_forward_proposes(tmp_path, verifier):
    # Model Runner V2 (vllm/v1/worker/gpu/), what vLLM picks on CUDA, through its own EagleSpeculator. float32 as on
    # CPU: V2 has no dtype restriction of its own and Triton attention, which CUDA falls back to from FlashAttention
    # (fp16/bf16 only), takes float32; so the assertions stay the CPU test's.
    _compare_with_vllm(tmp_path, verifier, LAYOUTS["eagle3.1"], "draft", "v2")
