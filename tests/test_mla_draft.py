"""The MLA draft layer (train.draft_layer mla): its attention against the absorbed form vLLM decodes in, its shape
from the verifier and train.mla, and its export and load in vLLM's deepseek_eagle3 format."""

import json

import pytest
import torch
from drafts import export_every_other_token
from pydantic import ValidationError
from safetensors.torch import load_file

from eagle3.errors import Eagle3Error
from eagle3.formats.exported_draft import check_draft, load_exported_draft, write_drafts
from eagle3.modeling.draft import MLA_KEYS, DraftConfig, Eagle3Draft
from eagle3.params.train import DraftAttention, DraftLayout, DraftMLA, TrainParams
from eagle3.plan.facts import KIMI_K2_5_TEXT_CONFIG
from eagle3.stages.vocab import mapping

LLAMA_VERIFIER = {
    "hidden_size": 48,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 12,
    "intermediate_size": 96,
    "num_hidden_layers": 8,
    "vocab_size": 100,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "rope_parameters": {"rope_type": "default", "rope_theta": 5000.0},
}
# A YaRN verifier with mscale_all_dim alone: both of DeepSeek YaRN's scales (cos/sin and softmax) are not 1, and the
# cos/sin scale is not the one transformers' yarn would infer.
YARN = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32, "mscale_all_dim": 0.7}


def mla_draft(mla: DraftMLA | None = None, seed: int = 0, verifier: dict = LLAMA_VERIFIER) -> Eagle3Draft:
    config = DraftConfig.from_verifier(
        verifier, (1, 4, 6), 40, layout=DraftLayout(fc_norm=True, norm_output=True), layer="mla", mla=mla
    )
    draft = Eagle3Draft(config)
    generator = torch.Generator().manual_seed(seed)
    draft.init_weights(generator)
    with torch.no_grad():
        for module in draft.modules():
            if hasattr(module, "eps"):
                module.weight.copy_(1 + 0.3 * torch.randn(module.weight.shape, generator=generator))
    return draft.double()


def _rope_interleaved(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """vLLM's is_neox_style=False rotation, written out: pair (2i, 2i+1) turns by position * theta^(-2i/d)."""
    dim = x.shape[-1]
    angles = positions[:, None].double() * theta ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    if x.dim() == 3:  # [T, heads, d]
        cos, sin = cos[:, None], sin[:, None]
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2)


def _vllm_deepseek_rope(rope_parameters: dict, rope_dim: int):
    """vLLM's own rotation and softmax scale for an MLA layer with this rope, as DeepseekV2MLAAttention builds them."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope
    from vllm.model_executor.layers.rotary_embedding.deepseek_scaling_rope import yarn_get_mscale

    with set_current_vllm_config(VllmConfig()):
        rotary = get_rope(
            rope_dim,
            max_position=256,
            rope_parameters={**rope_parameters, "rope_type": "deepseek_yarn"},
            is_neox_style=False,
            dtype=torch.float64,
        )

    def rotate(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        heads = x if x.dim() == 3 else x[:, None]
        rotated, _ = rotary.forward_native(positions, heads.clone(), heads.clone())
        return rotated if x.dim() == 3 else rotated[:, 0]

    mscale = yarn_get_mscale(rope_parameters["factor"], float(rope_parameters.get("mscale_all_dim", False)))
    return rotate, mscale * mscale


def _absorbed_attention(attn, inputs: list[torch.Tensor], rotate, scale: float = 1.0) -> list[torch.Tensor]:
    """Each TTT step's attention output for one sequence, computed as vLLM's MLA decode computes it: the cache holds
    only each position's normed compressed vector and its roped shared key; the query's no-rope part goes through
    kv_b_proj's key half into the compressed space, the output comes back through its value half. Step i's query
    at position t sees step 0's entries at positions <= t and steps 1..i's entries at t itself. `rotate(x,
    positions)` is the rope; `scale` multiplies the softmax scale 1/sqrt(nope + rope)."""
    tokens = inputs[0].shape[0]
    heads, nope, rope, v_dim, rank = attn.heads, attn.nope, attn.rope, attn.v_dim, attn.kv_lora_rank
    w_b = attn.kv_b_proj.weight.view(heads, nope + v_dim, rank)
    w_uk, w_uv = w_b[:, :nope], w_b[:, nope:]
    latents, rope_keys, outputs = [], [], []
    for step, x in enumerate(inputs):
        positions = torch.arange(tokens) + step
        compressed, k_rope = attn.kv_a_proj_with_mqa(x).split([rank, rope], -1)
        latents.append(attn.kv_a_layernorm(compressed))
        rope_keys.append(rotate(k_rope, positions))
        q = attn.query(x).view(tokens, heads, nope + rope)
        q_nope, q_rope = q[..., :nope], rotate(q[..., nope:], positions)
        q_latent = torch.einsum("thn,hnr->thr", q_nope, w_uk)
        rows = []
        for t in range(tokens):
            keys_latent = torch.cat([latents[0][: t + 1], *(latent[t : t + 1] for latent in latents[1:])])
            keys_rope = torch.cat([rope_keys[0][: t + 1], *(key[t : t + 1] for key in rope_keys[1:])])
            scores = (q_latent[t] @ keys_latent.T + q_rope[t] @ keys_rope.T) * scale / (nope + rope) ** 0.5
            rows.append(torch.einsum("hr,hvr->hv", scores.softmax(-1) @ keys_latent, w_uv).flatten())
        outputs.append(attn.o_proj(torch.stack(rows)))
    return outputs


@pytest.mark.parametrize(
    ("mla", "rope"),
    [
        (DraftMLA(), None),
        (DraftMLA(q_lora_rank=20, v_head_dim=20, qk_rope_head_dim=8), None),
        (DraftMLA(q_lora_rank=20, qk_rope_head_dim=8), YARN),
    ],
    ids=["derived", "set", "yarn"],
)
def test_mla_attention_equals_the_absorbed_form_vllm_decodes_in(mla, rope):
    """Forward and gradients of three TTT steps against the absorbed form over a latent-only cache, in float64 but for
    the norms, which compute in fp32 by design (eagle3/modeling/norms.py): a wiring error shows at 1e-3, rounding at
    1e-9. v_head_dim 20 > nope + rope covers the padding on the other side. Under YaRN the rotation and the softmax
    scale are vLLM's own (its DeepSeek YaRN rope, its yarn_get_mscale), whose cos/sin both sides compute in float32."""
    verifier = LLAMA_VERIFIER if rope is None else {**LLAMA_VERIFIER, "rope_parameters": {**rope, "rope_theta": 5000.0}}
    draft = mla_draft(mla, verifier=verifier)
    attn, parameters = draft.midlayer.self_attn, draft.config.rope["rope_parameters"]
    if rope is None:
        scale, tolerance = 1.0, 1e-6

        def rotate(x, positions):
            return _rope_interleaved(x, positions, parameters["rope_theta"])

    else:
        rotate, scale = _vllm_deepseek_rope(parameters, attn.rope)
        assert scale > 1.05, "the softmax scale must differ from 1 here, or the test checks nothing"
        tolerance = 1e-5
    tokens = 7
    generator = torch.Generator().manual_seed(3)
    inputs = [torch.randn(tokens, 2 * 48, generator=generator, dtype=torch.float64) for _ in range(3)]
    weights = [torch.randn(tokens, 48, generator=generator, dtype=torch.float64) for _ in range(3)]

    cache: list = []
    ours = []
    positions = torch.arange(tokens)[None]
    for step, x in enumerate(inputs):
        cos, sin = draft.rotary(x[None], positions + step)
        out, k, v = attn(x[None], cos, sin, tuple(cache))
        cache.append((k, v))
        ours.append(out[0])
    theirs = _absorbed_attention(attn, inputs, rotate, scale)

    def gradients(outputs):
        draft.zero_grad()
        sum((out * w).sum() for out, w in zip(outputs, weights, strict=True)).backward()
        return {name: p.grad.clone() for name, p in attn.named_parameters()}

    for step, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert torch.allclose(a, b, rtol=tolerance, atol=tolerance / 100), f"step {step}: {(a - b).abs().max()}"
    ours_grads, theirs_grads = gradients(ours), gradients(theirs)
    assert set(ours_grads) == set(theirs_grads)
    for name, grad in ours_grads.items():
        assert grad.abs().max() > 0, name
        assert torch.allclose(grad, theirs_grads[name], rtol=10 * tolerance, atol=tolerance / 10), (
            name,
            (grad - theirs_grads[name]).abs().max(),
        )


def test_mla_shape_from_an_mla_verifier_from_a_llama_one_and_from_train_mla():
    kimi = DraftConfig.from_verifier(KIMI_K2_5_TEXT_CONFIG, (2, 30, 58), 32000, layer="mla")
    assert (kimi.num_attention_heads, kimi.num_key_value_heads, kimi.head_dim) == (64, 64, 64)
    assert (kimi.q_lora_rank, kimi.kv_lora_rank, kimi.qk_nope_head_dim, kimi.qk_rope_head_dim, kimi.v_head_dim) == (
        1536,
        512,
        128,
        64,
        128,
    )
    # The MLA layer takes Kimi's own YaRN (the keys vLLM's DeepSeek YaRN reads); the Llama-style layer's rope for an
    # MLA verifier is unscaled at theta 1e6.
    assert kimi.rope == {
        "rope_parameters": {
            "rope_type": "yarn",
            **{key: value for key, value in KIMI_K2_5_TEXT_CONFIG["rope_scaling"].items() if key != "type"},
            "rope_theta": 50000.0,
        }
    }
    assert DraftConfig.from_verifier(KIMI_K2_5_TEXT_CONFIG, (2, 30, 58), 32000).rope == {
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}
    }
    llama = DraftConfig.from_verifier(LLAMA_VERIFIER, (1, 4, 6), 40, layer="mla")
    assert (llama.num_attention_heads, llama.q_lora_rank, llama.kv_lora_rank) == (4, 144, 48)
    assert (llama.qk_nope_head_dim, llama.qk_rope_head_dim, llama.v_head_dim, llama.head_dim) == (12, 6, 12, 6)
    assert llama.rope == {"rope_parameters": {"rope_type": "default", "rope_theta": 5000.0}}
    chosen = DraftConfig.from_verifier(
        KIMI_K2_5_TEXT_CONFIG, (2, 30, 58), 32000, layer="mla", mla=DraftMLA(q_lora_rank=768, kv_lora_rank=256)
    )
    assert (chosen.q_lora_rank, chosen.kv_lora_rank, chosen.qk_rope_head_dim) == (768, 256, 64)
    assert DraftConfig.from_verifier(KIMI_K2_5_TEXT_CONFIG, (2, 30, 58), 32000).draft_layer == "llama"


def test_mla_layer_refuses_what_vllm_would_compute_otherwise():
    with pytest.raises(ValidationError, match="no norm_before_fc"):
        TrainParams(draft_layer="mla", draft_layout=DraftLayout(norm_before_fc=True))
    with pytest.raises(ValidationError, match="q_lora_rank"):
        DraftMLA(q_lora_rank="none")
    with pytest.raises(ValidationError, match="must be even"):
        DraftMLA(qk_rope_head_dim=7)
    llama3 = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 64, "rope_theta": 5000.0}
    with pytest.raises(Eagle3Error, match="llama3-scaled.*rope_scaling: none, or a yarn mapping"):
        DraftConfig.from_verifier({**LLAMA_VERIFIER, "rope_parameters": llama3}, (1, 4, 6), 40, layer="mla")
    per_layer_type = {"full_attention": {"rope_type": "default", "rope_theta": 1e6}, "sliding_attention": {}}
    with pytest.raises(
        Eagle3Error, match="per layer type, and the draft has one layer; set train.attention.rope_theta"
    ):
        DraftConfig.from_verifier({**LLAMA_VERIFIER, "rope_parameters": per_layer_type}, (1, 4, 6), 40, layer="mla")
    # vLLM's DeepSeek YaRN reads original_max_position_embeddings; transformers' yarn would default it.
    yarn = {**LLAMA_VERIFIER, "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 5000.0}}
    with pytest.raises(Eagle3Error, match="no original_max_position_embeddings"):
        DraftConfig.from_verifier(yarn, (1, 4, 6), 40, layer="mla")
    unscaled = DraftConfig.from_verifier(
        yarn, (1, 4, 6), 40, attention=DraftAttention(rope_scaling="none"), layer="mla"
    )
    assert unscaled.rope == {"rope_parameters": {"rope_type": "default", "rope_theta": 5000.0}}
    # What vLLM does not read is not carried: it always truncates, and an attention_factor would change its rope.
    extra = {**YARN, "truncate": False, "attention_factor": 1.0, "rope_theta": 5000.0}
    carried = DraftConfig.from_verifier({**LLAMA_VERIFIER, "rope_parameters": extra}, (1, 4, 6), 40, layer="mla")
    assert carried.rope == {"rope_parameters": {**YARN, "rope_theta": 5000.0}}


def test_mla_draft_exports_as_vllm_deepseek_eagle3_loads_it_and_back(tmp_path):
    """The vLLM format with the architecture vLLM maps to Eagle3DeepseekV2ForCausalLM and every tensor its loader
    reads; loaded back (as the offline estimate loads it) it computes what the trained draft does; the speculators
    directory says why it holds no draft, and a speculators draft left there by an earlier export is gone."""
    draft = mla_draft(DraftMLA(q_lora_rank=20)).float()
    verifier = tmp_path / "verifier"
    verifier.mkdir()
    (verifier / "config.json").write_text(json.dumps(LLAMA_VERIFIER))
    (tmp_path / "speculators").mkdir()
    (tmp_path / "speculators/config.json").write_text("{}")
    d2t, t2d = export_every_other_token(
        draft,
        tmp_path,
        100,
        dtype="float32",
        k=3,
        verifier_name="tiny/verifier",
        architectures=["LlamaForCausalLM"],
        draft_tokens=40,
    )
    config = json.loads((tmp_path / "draft/config.json").read_text())
    assert (config["architectures"], config["model_type"]) == (["Eagle3DeepseekV2ForCausalLM"], "deepseek_v2")
    assert {key: config[key] for key in MLA_KEYS} == {
        "q_lora_rank": 20,
        "kv_lora_rank": 48,
        "qk_nope_head_dim": 12,
        "qk_rope_head_dim": 6,
        "v_head_dim": 12,
    }
    assert config["rope_parameters"] == {"rope_type": "default", "rope_theta": 5000.0}
    names = set(load_file(tmp_path / "draft/model.safetensors"))
    attention = {name.removeprefix("midlayer.self_attn.") for name in names if "self_attn" in name}
    assert attention == {
        f"{name}.weight"
        for name in ("q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj")
    } | {"o_proj.weight"}
    assert sorted(path.name for path in (tmp_path / "speculators").iterdir()) == ["README.md"]
    assert "Eagle3DeepseekV2ForCausalLM" in (tmp_path / "speculators/README.md").read_text()
    assert check_draft(tmp_path / "draft", verifier, draft.config.layout) == []
    loaded, _ = load_exported_draft(tmp_path / "draft")
    assert loaded.config == draft.config
    ids, aux = torch.randint(0, 100, (1, 12)), torch.randn(1, 12, 144) * 30
    embed = torch.nn.Embedding(100, 48)
    with torch.no_grad():
        for ours, theirs in zip(
            draft.eval().unroll(ids, aux, embed, 3), loaded.unroll(ids, aux, embed, 3), strict=True
        ):
            assert torch.allclose(ours, theirs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "breakage, expected",
    [
        (lambda c: c.pop("qk_rope_head_dim"), "config qk_rope_head_dim is missing: an MLA draft"),
        (lambda c: c.update(model_type="deepseek_v3"), "model_type is 'deepseek_v3', expected 'deepseek_v2'"),
        (lambda c: c.update(architectures=["LlamaForCausalLMEagle3"]), "expected ['Eagle3DeepseekV2ForCausalLM']"),
        (lambda c: c.update(kv_lora_rank=32), "tensor midlayer.self_attn.kv_a_layernorm.weight has shape [48]"),
    ],
    ids=["missing-key", "mtp-model-type", "llama-architecture", "rank-disagrees"],
)
def test_validate_draft_checks_the_mla_keys_vllm_reads(tmp_path, breakage, expected):
    draft = mla_draft().float()
    verifier = tmp_path / "verifier"
    verifier.mkdir()
    (verifier / "config.json").write_text(json.dumps(LLAMA_VERIFIER))
    d2t, t2d = mapping(torch.arange(0, 80, 2), 100)
    write_drafts(draft, d2t, t2d, tmp_path / "draft", tmp_path / "speculators", dtype="bfloat16",
                 num_speculative_tokens=3, verifier_name="v", verifier_architectures=["LlamaForCausalLM"])  # fmt: skip
    path = tmp_path / "draft/config.json"
    config = json.loads(path.read_text())
    breakage(config)
    path.write_text(json.dumps(config))
    assert any(expected in problem for problem in check_draft(tmp_path / "draft", verifier)), check_draft(
        tmp_path / "draft", verifier
    )
