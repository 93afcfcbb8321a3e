"""The draft model, its export and validation, without the pipeline: small shapes, exact checks."""

import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from eagle3.formats.exported_draft import check_draft, load_exported_draft, write_drafts
from eagle3.modeling.draft import DraftConfig, Eagle3Draft
from eagle3.params.train import DraftAttention, DraftLayout
from eagle3.stages.vocab import mapping, select

from conftest import eagle3

VERIFIER = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "intermediate_size": 64,
    "num_hidden_layers": 12,
    "vocab_size": 100,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
}


# The layouts vLLM's llama_eagle3.py runs: the 2024 one, EAGLE 3.1 and speculators' default, and every switch alone.
LAYOUTS = {
    "2024": DraftLayout(),
    "eagle3.1": DraftLayout(fc_norm=True, norm_output=True),
    "speculators": DraftLayout(norm_before_fc=True, norm_output=True, norm_before_residual=True),
    "both-aux-norms": DraftLayout(fc_norm=True, norm_before_fc=True),
    "norm_before_residual": DraftLayout(norm_before_residual=True),
}


def tiny_draft(
    seed: int = 0, attention: DraftAttention | None = None, layout: DraftLayout | None = None
) -> Eagle3Draft:
    config = DraftConfig.from_verifier(VERIFIER, (2, 6, 9), draft_vocab_size=40, attention=attention, layout=layout)
    draft = Eagle3Draft(config)
    generator = torch.Generator().manual_seed(seed)
    draft.init_weights(generator)
    with torch.no_grad():  # non-trivial norms and scale, so a wrong wiring shows
        for module in draft.modules():
            if hasattr(module, "eps"):
                module.weight.copy_(1 + 0.3 * torch.randn(module.weight.shape, generator=generator))
        if not config.layout.normalises_aux:  # as training leaves it (the draft's doc says why)
            draft.aux_scale.copy_(0.5 + torch.rand(draft.aux_scale.shape, generator=generator) * 4)
    return draft


def test_vocab_keeps_the_most_frequent_answer_tokens_and_maps_them_as_vllm_reads_them():
    masked = torch.tensor([0, 7, 7, 1, 0, 0, 3, 0])
    every = torch.tensor([50, 7, 9, 1, 4, 0, 3, 2])
    chosen = select(masked, every, 5)
    # answers first (1 and 2 tie at 7: 2 is more frequent overall), then 6, 3, then the most frequent other token (0)
    assert chosen.tolist() == [0, 1, 2, 3, 6]
    d2t, t2d = mapping(chosen, 8)
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool
    assert (torch.arange(5) + d2t).tolist() == [0, 1, 2, 3, 6]
    assert t2d.tolist() == [True, True, True, True, False, False, True, False]


def _rope(draft, x, position):
    cos, sin = draft.rotary(x, torch.tensor([[position]]))
    return cos[0, 0], sin[0, 0]


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def _reference_step(draft, embed, token, hidden, position, cache):
    """One draft step for ONE position, written out as vLLM runs it (llama_eagle3.py's LlamaDecoderLayer): explicit
    keys list, explicit softmax; its output and what the next step receives (`norm_output`)."""
    layer, attn = draft.midlayer, draft.midlayer.self_attn
    normed = layer.hidden_norm(hidden)
    x = torch.cat([layer.input_layernorm(embed(torch.tensor(token))), normed])
    cos, sin = _rope(draft, x, position)
    q = attn.q_proj(x).view(attn.heads, attn.head_dim)
    k = attn.k_proj(x).view(attn.kv_heads, attn.head_dim)
    v = attn.v_proj(x).view(attn.kv_heads, attn.head_dim)
    cache.append((_rotate(k, cos, sin), v))
    q = _rotate(q, cos, sin)
    group = attn.heads // attn.kv_heads
    heads = []
    for h in range(attn.heads):
        keys = torch.stack([key[h // group] for key, _ in cache])
        values = torch.stack([value[h // group] for _, value in cache])
        weights = torch.softmax(keys @ q[h] / math.sqrt(attn.head_dim), 0)
        heads.append(weights @ values)
    residual = attn.o_proj(torch.cat(heads)) + (normed if draft.config.norm_before_residual else hidden)
    output = layer.mlp(layer.post_attention_layernorm(residual)) + residual
    return output, draft.norm(output) if draft.config.norm_output else output


def _reference_fc_input(draft, aux):
    """vLLM's combine_hidden_states before fc: input_norm over all aux states, then fc_norm per layer."""
    x = aux / draft.aux_scale
    if draft.config.norm_before_fc:
        x = draft.input_norm(x)
    if draft.config.fc_norm:
        x = torch.cat([draft.fc_norm[i](part) for i, part in enumerate(x.split(32, -1))], -1)
    return x


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_training_time_test_unroll_equals_vllm_style_step_by_step_drafting(layout):
    torch.manual_seed(0)
    draft = tiny_draft(layout=layout).eval()
    embed = nn.Embedding(100, 32)
    tokens, steps = 9, 3
    ids = torch.randint(0, 100, (1, tokens))
    aux = torch.randn(1, tokens, 96) * 5
    with torch.no_grad():
        features = draft.unroll(ids, aux, embed, steps)
        fused = draft.fc(_reference_fc_input(draft, aux[0]))
        for t in range(tokens - 1 - steps):
            # context: the first pass over positions 0..t (token t+1 at slot t), then steps 1.. at position t only
            cache = []
            for s in range(t + 1):
                output, hidden = _reference_step(draft, embed, int(ids[0, s + 1]), fused[s], s, cache)
            context = cache[: t + 1]
            assert torch.allclose(features[0][0, t], output, atol=1e-5), f"step 0, position {t}"
            cache = list(context)
            for i in range(1, steps):
                output, hidden = _reference_step(draft, embed, int(ids[0, t + 1 + i]), hidden, t + i, cache)
                assert torch.allclose(features[i][0, t], output, atol=1e-5), f"step {i}, position {t}"


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_each_layout_exports_and_loads_back_as_the_same_draft(tmp_path, layout):
    """Export writes the layout's switches and norm tensors; the draft loaded back from them (as the offline
    estimate loads it) computes what the trained one does, and the validator finds nothing to object to."""
    draft = tiny_draft(layout=layout)
    export_beside_verifier(tmp_path, draft, "float32")
    config = json.loads((tmp_path / "draft/config.json").read_text())
    assert {key: config[key] for key in DraftLayout.model_fields} == layout.model_dump()
    speculators = json.loads((tmp_path / "speculators/config.json").read_text())
    assert {key: speculators[key] for key in DraftLayout.model_fields} == layout.model_dump()
    assert not set(DraftLayout.model_fields) & set(speculators["transformer_layer_config"])
    tensors = load_file(tmp_path / "draft/model.safetensors")
    assert ("input_norm.weight" in tensors) == layout.norm_before_fc
    assert ("fc_norm.2.weight" in tensors) == layout.fc_norm
    loaded, _ = load_exported_draft(tmp_path / "draft")
    assert loaded.config.layout == layout
    ids, aux = torch.randint(0, 100, (1, 12)), torch.randn(1, 12, 96) * 30
    embed = nn.Embedding(100, 32)
    with torch.no_grad():
        for ours, theirs in zip(
            draft.eval().unroll(ids, aux, embed, 3), loaded.unroll(ids, aux, embed, 3), strict=True
        ):
            assert torch.allclose(ours, theirs, rtol=1e-4, atol=1e-4)
    for directory in ("draft", "speculators"):
        assert check_draft(tmp_path / directory, tmp_path / "verifier", layout) == []


def test_export_folds_the_input_scale_into_fc():
    draft = tiny_draft()
    aux = torch.randn(5, 96) * 30
    exported = draft.export_state(torch.float32)
    assert "aux_scale" not in exported and not any("rotary" in name for name in exported)
    assert torch.allclose(aux @ exported["fc.weight"].T, draft.fc(aux / draft.aux_scale), rtol=1e-4, atol=1e-4)


def export_beside_verifier(directory, draft: Eagle3Draft, dtype: str) -> None:
    """`directory`/verifier (VERIFIER's config) and the draft exported to `directory`/draft and /speculators, with
    every even token of the first 80 as its vocabulary."""
    verifier = directory / "verifier"
    verifier.mkdir()
    (verifier / "config.json").write_text(json.dumps(VERIFIER))
    d2t, t2d = mapping(torch.arange(0, 80, 2), 100)
    write_drafts(
        draft,
        d2t,
        t2d,
        directory / "draft",
        directory / "speculators",
        dtype=dtype,
        num_speculative_tokens=3,
        verifier_name="tiny/verifier",
        verifier_architectures=["LlamaForCausalLM"],
    )


@pytest.fixture
def exported(tmp_path):
    export_beside_verifier(tmp_path, tiny_draft(), "bfloat16")
    return tmp_path


def test_export_writes_the_vllm_contract(exported):
    config = json.loads((exported / "draft/config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 6, 9]
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 6, 9] and config["num_aux_hidden_states"] == 3
    assert (config["num_hidden_layers"], config["draft_vocab_size"], config["vocab_size"]) == (1, 40, 100)
    assert config["tie_word_embeddings"] is False and config["max_position_embeddings"] == 256
    assert config["rope_parameters"] == VERIFIER["rope_parameters"]
    tensors = load_file(exported / "draft/model.safetensors")
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    assert (torch.arange(40) + tensors["d2t"]).tolist() == list(range(0, 80, 2))
    assert tensors["fc.weight"].shape == (32, 96) and tensors["fc.weight"].dtype == torch.bfloat16
    assert tensors["midlayer.self_attn.q_proj.weight"].shape == (32, 64)
    assert tensors["midlayer.self_attn.k_proj.weight"].shape == (16, 64)
    assert "embed_tokens.weight" not in tensors
    speculators = json.loads((exported / "speculators/config.json").read_text())
    assert speculators["speculators_model_type"] == "eagle3" and speculators["norm_before_residual"] is False
    assert speculators["speculators_config"]["verifier"]["name_or_path"] == "tiny/verifier"
    assert "layers.0.self_attn.q_proj.weight" in load_file(exported / "speculators/model.safetensors")
    assert check_draft(exported / "draft", exported / "verifier") == []
    assert check_draft(exported / "speculators", exported / "verifier") == []


def _edit_config(directory, **changes):
    path = directory / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config))


def _edit_tensors(directory, **changes):
    path = directory / "model.safetensors"
    tensors = load_file(path)
    tensors.update(changes)
    save_file(tensors, path)


@pytest.mark.parametrize(
    "breakage, expected",
    [
        (
            lambda d: _edit_config(d, eagle_config={}, eagle_aux_hidden_state_layer_ids=None),
            "eagle_aux_hidden_state_layer_ids is missing",
        ),
        (
            lambda d: _edit_config(d, eagle_aux_hidden_state_layer_ids=None),
            "eagle_aux_hidden_state_layer_ids is only inside eagle_config: vLLM's V2 model runner reads the top-level",
        ),
        (
            lambda d: _edit_config(d, eagle_aux_hidden_state_layer_ids=[2, 6, 8]),
            "eagle_aux_hidden_state_layer_ids is [2, 6, 8] at the top level but [2, 6, 9] in eagle_config",
        ),
        (
            lambda d: _edit_config(
                d,
                eagle_aux_hidden_state_layer_ids=[6, 2, 9],
                eagle_config={"eagle_aux_hidden_state_layer_ids": [6, 2, 9], "use_aux_hidden_state": True},
            ),
            "eagle_aux_hidden_state_layer_ids [6, 2, 9] must be distinct and ascending",
        ),
        # A layout with per-layer aux norms reads tensors this draft does not have.
        (lambda d: _edit_config(d, fc_norm=True), "tensor fc_norm.0.weight is missing"),
        (lambda d: _edit_config(d, norm_before_fc=True), "tensor input_norm.weight is missing"),
        (lambda d: _edit_config(d, tie_word_embeddings=True), "tie_word_embeddings must be false"),
        (
            lambda d: _edit_config(d, max_position_embeddings=128),
            "max_position_embeddings is 128, must be >= the verifier's 256",
        ),
        (
            lambda d: _edit_config(d, num_key_value_heads=3),
            "config num_key_value_heads 3 must be a positive divisor of num_attention_heads 4",
        ),
        (lambda d: _edit_config(d, hidden_size=48), "config hidden_size is 48, the verifier needs 32"),
        (lambda d: _edit_tensors(d, d2t=torch.arange(0, 40).float()), "tensor d2t has dtype float32, expected int64"),
        # A dtype the contract never uses is named as safetensors stores it, not mistaken for another.
        (
            lambda d: _edit_tensors(d, d2t=torch.arange(0, 40, dtype=torch.int32)),
            "tensor d2t has dtype I32, expected int64",
        ),
        (
            lambda d: _edit_tensors(d, **{"fc.weight": torch.zeros(32, 64, dtype=torch.bfloat16)}),
            "tensor fc.weight has shape [32, 64], expected [32, 96]",
        ),
        (
            lambda d: _edit_tensors(d, d2t=torch.zeros(40, dtype=torch.int64)),
            "t2d does not mark exactly the target tokens",
        ),
    ],
)
def test_validate_draft_names_each_mismatch_in_one_line(exported, breakage, expected):
    breakage(exported / "draft")
    result = eagle3(exported, "validate-draft", "draft", "--verifier", "verifier", check=False)
    assert result.returncode == 2
    assert expected in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr


def test_speculators_export_writes_norm_before_residual_against_its_loader_default(exported):
    _edit_config(exported / "speculators", norm_before_residual=None)
    assert check_draft(exported / "speculators", exported / "verifier") == [
        "norm_before_residual is missing, and vLLM's speculators loader defaults it to true: write it as the draft "
        "was trained"
    ]


def test_export_checks_each_switch_against_the_trained_layout(exported):
    """A switch that adds no tensor (norm_output, norm_before_residual) changes only what vLLM computes: export
    checks it against the checkpoint's layout."""
    _edit_config(exported / "draft", norm_output=True)
    assert check_draft(exported / "draft", exported / "verifier") == []
    assert check_draft(exported / "draft", exported / "verifier", DraftLayout()) == [
        "norm_output reads as true in vLLM, but the draft was trained with false"
    ]


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_vllm_reads_the_exported_layers_and_layout_from_either_format(tmp_path, layout):
    """Both exports as vLLM's own config loaders read them: the captured layers its V2 model runner takes (the top
    level only) and its V1 runner takes, the aux count that sizes fc, and every layout switch as trained."""
    from types import SimpleNamespace

    from vllm.transformers_utils.config import get_config
    from vllm.transformers_utils.configs.eagle import EAGLEConfig
    from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import get_eagle3_aux_layers_from_config

    export_beside_verifier(tmp_path, tiny_draft(layout=layout), "bfloat16")
    for directory in ("draft", "speculators"):
        config = get_config(str(tmp_path / directory), trust_remote_code=False)
        if directory == "draft":  # as vLLM's SpeculativeConfig wraps a plain config for method eagle3
            config = EAGLEConfig(config, method="eagle3", model_type="eagle")
            assert config.eagle_config["eagle_aux_hidden_state_layer_ids"] == [2, 6, 9]  # the V1 runner's fallback
        runner = SimpleNamespace(draft_model_config=SimpleNamespace(hf_config=config))
        assert get_eagle3_aux_layers_from_config(runner) == (2, 6, 9), directory
        assert config.num_aux_hidden_states == 3, directory
        assert {key: getattr(config, key) for key in DraftLayout.model_fields} == layout.model_dump(), directory


def test_validate_draft_accepts_a_valid_export(exported):
    result = eagle3(exported, "validate-draft", "draft", "--verifier", "verifier")
    assert "valid EAGLE-3 draft" in result.stdout


# DeepSeek-V3 / Kimi-K2.5's text config, abridged: MLA's numbers (128 heads, qk_rope_head_dim 64, YaRN) say nothing
# about a Llama draft layer.
KIMI_TEXT = {
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "head_dim": 64,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "intermediate_size": 18432,
    "num_hidden_layers": 61,
    "vocab_size": 163840,
    "max_position_embeddings": 262144,
    "rope_theta": 50000.0,
    "rope_scaling": {"type": "yarn", "factor": 64.0, "mscale": 1.0, "mscale_all_dim": 1.0},
}


def test_draft_shape_from_the_verifier_or_train_attention():
    llama = DraftConfig.from_verifier(VERIFIER, (2, 6, 9), 40)
    assert (llama.num_attention_heads, llama.num_key_value_heads, llama.head_dim) == (4, 2, 8)
    assert llama.rope == {"rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}}  # verbatim

    # An MLA verifier, plain or wrapped multimodally: the published Kimi-K2.5 draft shape.
    for config in (KIMI_TEXT, {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": KIMI_TEXT}):
        kimi = DraftConfig.from_verifier(config, (2, 30, 58), 32000)
        assert (kimi.num_attention_heads, kimi.num_key_value_heads, kimi.head_dim) == (64, 64, 128)
        assert kimi.rope == {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}
        assert (kimi.hidden_size, kimi.vocab_size) == (7168, 163840)

    chosen = DraftConfig.from_verifier(
        KIMI_TEXT, (2, 30, 58), 32000, attention=DraftAttention(num_attention_heads=32, head_dim=96)
    )
    assert (chosen.num_attention_heads, chosen.num_key_value_heads, chosen.head_dim) == (32, 32, 96)
    yarn = DraftConfig.from_verifier(
        VERIFIER, (2, 6, 9), 40, attention=DraftAttention(rope_scaling={"rope_type": "yarn", "factor": 4.0})
    )
    assert yarn.rope == {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}}
    plain = DraftConfig.from_verifier(KIMI_TEXT | {"kv_lora_rank": None} | {"rope_parameters": None}, (2,), 8)
    assert plain.rope == {"rope_theta": 50000.0, "rope_scaling": KIMI_TEXT["rope_scaling"]}
    unscaled = DraftConfig.from_verifier(
        {k: v for k, v in KIMI_TEXT.items() if k != "kv_lora_rank"},
        (2,),
        8,
        attention=DraftAttention(rope_scaling="none"),
    )
    assert unscaled.rope == {"rope_parameters": {"rope_type": "default", "rope_theta": 50000.0}}


def test_validate_draft_accepts_an_attention_shape_of_its_own(tmp_path):
    """A draft with 2 heads x 16 (the verifier has 4 x 8) is valid: only hidden size and vocabulary are shared.
    Reloaded, it is the same model (evaluate's offline estimate reads it this way)."""
    draft = tiny_draft(attention=DraftAttention(num_attention_heads=2, num_key_value_heads=1, head_dim=16))
    export_beside_verifier(tmp_path, draft, "float32")
    assert check_draft(tmp_path / "draft", tmp_path / "verifier") == []
    reloaded, _ = load_exported_draft(tmp_path / "draft")
    assert (reloaded.config.num_attention_heads, reloaded.config.head_dim) == (2, 16)
    original = draft.state_dict()
    projections = [name for name in reloaded.state_dict() if name.endswith("_proj.weight")]
    assert len(projections) == 7  # q, k, v, o and the MLP's three
    for name in projections:
        assert torch.equal(reloaded.state_dict()[name], original[name].float()), name
