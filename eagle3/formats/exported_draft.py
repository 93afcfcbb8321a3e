"""The exported draft: vLLM's classic EAGLE-3 format and the speculators format, written, validated and loaded here.
One module on purpose, past ~450 lines: the writer, the loader and the validator share the format's typed keys,
its layout switches and the vocab-map check; split, the contract would be stated in more than one place.

models/draft/ (vLLM's classic EAGLE-3 format, llama_eagle3.py):
  config.json        LlamaForCausalLMEagle3, num_hidden_layers 1, vocab_size = the verifier's, draft_vocab_size,
                     hidden/heads/KV heads/head_dim/rope from the verifier, max_position_embeddings = the
                     verifier's, tie_word_embeddings false, the layout's four switches (fc_norm, norm_before_fc,
                     norm_output, norm_before_residual) and num_aux_hidden_states, the captured layers ALWAYS
                     written, both at the top level (vLLM's V2 model runner reads only that) and in
                     eagle_config.eagle_aux_hidden_state_layer_ids (without them vLLM captures other layers and
                     acceptance collapses to ~1%)
  model.safetensors  fc.weight [H, 3H], midlayer.{input_layernorm, hidden_norm, post_attention_layernorm}.weight,
                     midlayer.self_attn.{q,k,v}_proj.weight [*, 2H], midlayer.self_attn.o_proj.weight,
                     midlayer.mlp.{gate,up,down}_proj.weight, norm.weight, lm_head.weight [draft_vocab, H] in
                     export.dtype, input_norm.weight [3H] (norm_before_fc) and fc_norm.{i}.weight [H] (fc_norm);
                     d2t int64 [draft_vocab], t2d bool [vocab]; no embed_tokens (vLLM shares the verifier's)
models/draft-speculators/: the same tensors (midlayer.* named layers.0.*) with a speculators config: the layer's
  keys in transformer_layer_config, the switches and captured layers at its top level (every switch written: its
  default for norm_before_residual there is true).

The MLA draft layer (train.draft_layer mla) is vLLM's deepseek_eagle3.py format instead: Eagle3DeepseekV2ForCausalLM,
model_type deepseek_v2 (deepseek_v3 would make vLLM load it as a DeepSeek MTP layer), the MLA shape (q_lora_rank,
kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim), head_dim = qk_rope_head_dim, rope_parameters, and
midlayer.self_attn.{q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj}
(vLLM loads the first and fourth as one fused projection, so q_lora_rank is always set). It has no speculators
form vLLM loads (vLLM's speculators config maps only Llama and Qwen3 layers): models/draft-speculators/ then holds
only a README.md that says so.

`check_draft` / `validate_draft` (`eagle3 validate-draft DIR --verifier DIR`) check a draft against this
contract and its verifier before anyone serves it. Each pitfall that silently wrecks acceptance in vLLM is a
named check: missing or unsorted aux layer ids, a float d2t, tied embeddings, a short max_position_embeddings,
shapes that disagree with the verifier, a d2t/t2d pair that maps to the wrong tokens, a layout switch that vLLM
would read otherwise than the draft was trained with. Every mismatch is listed in one error.

Drafts are pulled from remotes and handed between people, so every file is read as untrusted first
(eagle3/formats/hf_config.py, tensor_files.py): a file that is unreadable, not UTF-8 JSON, or a field of the
wrong type (`"8192"`, `eagle_aux_hidden_state_layer_ids: 5`), and weights that are not a whole safetensors file,
are one error naming the file and the field before any contract check runs; no tensor is loaded before its
shape and dtype are checked against the config.
"""

from pathlib import Path
from typing import Annotated, Any, Literal

import torch
from pydantic import Field, TypeAdapter, with_config
from safetensors.torch import save_file
from typing_extensions import TypedDict

from eagle3.errors import Eagle3Error
from eagle3.files import atomic_path, write_json
from eagle3.formats.hf_config import (
    CONFIG,
    FIELDS,
    Eps,
    LanguageModel,
    Name,
    Size,
    check_fields,
    read_config,
    read_json,
    require,
)
from eagle3.formats.tensor_files import load_tensor, matching_tensors, tensor_headers
from eagle3.modeling.draft import MLA_KEYS, DraftConfig, Eagle3Draft
from eagle3.params.train import DraftLayout

WEIGHTS = "model.safetensors"
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
# safetensors' dtype names as the validator reports them.
_SAFETENSORS_DTYPES = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "I64": torch.int64,
    "BOOL": torch.bool,
}
_VERIFIER_HINT = "--verifier must be the verifier's Hugging Face model directory"
_DRAFT_FIX = "re-export the draft (`eagle3 export`) or fetch it again"
_EXPORT_FIX = "rerun `eagle3 export` to rewrite it"
# Whether the ids are layers of the verifier is a contract check (a named problem); that they are a list of ints,
# short enough to print, is the file's shape.
_AuxIds = Annotated[list[int], Field(max_length=1024)]


@with_config(FIELDS)
class _EagleConfig(TypedDict, total=False):
    eagle_aux_hidden_state_layer_ids: _AuxIds | None
    use_aux_hidden_state: bool | None


@with_config(FIELDS)
class _VllmDraft(LanguageModel, total=False):
    """The keys of a vLLM-format draft config read here; the layer's own are a model config's (LanguageModel)."""

    draft_vocab_size: Size | None
    fc_norm: bool | None
    norm_before_fc: bool | None
    norm_output: bool | None
    norm_before_residual: bool | None
    eagle_aux_hidden_state_layer_ids: _AuxIds | None
    eagle_config: _EagleConfig | None
    torch_dtype: Name | None
    # The MLA layer's shape (MLA_KEYS).
    q_lora_rank: Size | None
    qk_nope_head_dim: Size | None
    qk_rope_head_dim: Size | None
    v_head_dim: Size | None


@with_config(FIELDS)
class _ProposalMethod(TypedDict, total=False):
    speculative_tokens: Size | None


@with_config(FIELDS)
class _Speculators(TypedDict, total=False):
    proposal_methods: list[_ProposalMethod] | None


@with_config(FIELDS)
class _SpeculatorsDraft(TypedDict, total=False):
    speculators_model_type: Name | None
    transformer_layer_config: LanguageModel | None
    speculators_config: _Speculators | None
    draft_vocab_size: Size | None
    fc_norm: bool | None
    norm_before_fc: bool | None
    norm_output: bool | None
    norm_before_residual: bool | None
    eagle_aux_hidden_state_layer_ids: _AuxIds | None


@with_config(FIELDS)
class _ExportedEagle(TypedDict):
    eagle_aux_hidden_state_layer_ids: Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1, max_length=1024)]


@with_config(FIELDS)
class _Exported(TypedDict):
    """What `load_exported_draft` builds the draft from: every key `DraftConfig.from_exported` reads, as export
    writes it."""

    hidden_size: Size
    num_attention_heads: Size
    num_key_value_heads: Size
    head_dim: Size
    intermediate_size: Size
    rms_norm_eps: Eps
    hidden_act: Name
    vocab_size: Size
    draft_vocab_size: Size
    max_position_embeddings: Size
    eagle_config: _ExportedEagle
    torch_dtype: Literal["bfloat16", "float16", "float32"]


_VLLM_DRAFT, _SPECULATORS_DRAFT, _EXPORTED = (
    TypeAdapter(_VllmDraft),
    TypeAdapter(_SpeculatorsDraft),
    TypeAdapter(_Exported),
)


# The draft-layout switches (params train.draft_layout: DraftLayout) are vLLM's config keys, read by its EAGLE-3
# models (llama_eagle3.py) at the config's top level; speculators' config conversion copies them from its own top
# level. Every one is written: the loaders' defaults differ (vLLM's speculators path defaults norm_before_residual
# to true, the others to false).
LAYOUT_KEYS = tuple(DraftLayout.model_fields)
# What vLLM's speculators loader assumes for a switch its config leaves out (the vLLM format's loaders: false).
_SPECULATORS_DEFAULTS = {"norm_before_residual": True}


# The vLLM-format architecture (and the model type it is built from) per draft layer; the loaders accept the aliases.
ARCHITECTURES = {
    "llama": ("LlamaForCausalLMEagle3", "llama", {"LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM"}),
    "mla": (
        "Eagle3DeepseekV2ForCausalLM",
        "deepseek_v2",
        {"Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM"},
    ),
}
SPECULATORS_README = "README.md"
# Why a draft has no speculators-format copy, by what it is.
_NO_SPECULATORS_FORM = {
    "mla": "This draft's decoder layer is MLA (multi-head latent attention, `train.draft_layer: mla`). vLLM loads it\n"
    "from the vLLM format in `models/draft/` (`Eagle3DeepseekV2ForCausalLM`); vLLM's speculators-format loader maps\n"
    "only Llama and Qwen3 EAGLE-3 draft layers, so no speculators-format copy is written. Serve `models/draft/`.\n",
    "dflash": "This draft is a DFlash block draft (`train.draft_method: dflash`). vLLM loads it from `models/draft/`\n"
    "(`DFlashDraftModel`, `method: dflash`); vLLM's speculators-format loader reads EAGLE-3 drafts only, so no\n"
    "speculators-format copy is written. Serve `models/draft/`.\n",
}


def vllm_config(config: DraftConfig, dtype: str) -> dict[str, Any]:
    aux = list(config.aux_layer_ids)
    architecture, model_type, _ = ARCHITECTURES[config.draft_layer]
    mla = {key: getattr(config, key) for key in MLA_KEYS} if config.draft_layer == "mla" else {}
    return {
        "architectures": [architecture],
        "model_type": model_type,
        "num_hidden_layers": 1,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_act": config.hidden_act,
        "rms_norm_eps": config.rms_norm_eps,
        "max_position_embeddings": config.max_position_embeddings,
        "vocab_size": config.vocab_size,
        "draft_vocab_size": config.draft_vocab_size,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        **config.layout.model_dump(),
        "num_aux_hidden_states": len(aux),
        "torch_dtype": dtype,
        # vLLM's V1 model runner reads the captured layers from either place, its V2 runner from the top level only
        # (without it, V2 captures the verifier's default layers whatever the draft was trained on).
        "eagle_aux_hidden_state_layer_ids": aux,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux, "use_aux_hidden_state": True},
        **config.rope,
        **mla,
    }


def speculators_config(
    config: DraftConfig, dtype: str, verifier_name: str, verifier_architectures: list[str], tokens: int
) -> dict[str, Any]:
    top_level = ("architectures", "eagle_config", "eagle_aux_hidden_state_layer_ids", "draft_vocab_size", "torch_dtype")
    layer = {
        key: value
        for key, value in vllm_config(config, dtype).items()
        if key not in top_level and key not in LAYOUT_KEYS
    }
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": tokens}],
            "verifier": {"name_or_path": verifier_name, "architectures": verifier_architectures},
        },
        "transformer_layer_config": layer,
        "draft_vocab_size": config.draft_vocab_size,
        "target_hidden_size": config.hidden_size,
        **config.layout.model_dump(),
        "eagle_aux_hidden_state_layer_ids": list(config.aux_layer_ids),
        "torch_dtype": dtype,
    }


def write_drafts(
    draft: Eagle3Draft,
    d2t: torch.Tensor,
    t2d: torch.Tensor,
    vllm_dir: Path,
    speculators_dir: Path,
    *,
    dtype: str,
    num_speculative_tokens: int,
    verifier_name: str,
    verifier_architectures: list[str],
) -> None:
    """Both formats of one draft (the MLA layer: the vLLM format, and the speculators directory's README saying why
    it holds no draft); `num_speculative_tokens` and the verifier go into the speculators config."""
    tensors = {**draft.export_state(DTYPES[dtype]), "d2t": d2t.to(torch.int64), "t2d": t2d.to(torch.bool)}
    _write(vllm_dir, vllm_config(draft.config, dtype), tensors)
    if not has_speculators_form(draft.config):
        no_speculators_form(speculators_dir, "mla")
        return
    (speculators_dir / SPECULATORS_README).unlink(missing_ok=True)
    renamed = {name.replace("midlayer.", "layers.0.", 1): tensor for name, tensor in tensors.items()}
    config = speculators_config(draft.config, dtype, verifier_name, verifier_architectures, num_speculative_tokens)
    _write(speculators_dir, config, renamed)


def has_speculators_form(config: DraftConfig) -> bool:
    return config.draft_layer == "llama"


def no_speculators_form(speculators_dir: Path, why: str) -> None:
    """The speculators directory of a draft that has no such form: only the README saying `why` (a key of
    _NO_SPECULATORS_FORM)."""
    # A speculators draft left from an earlier export would be served as this one.
    for stale in (CONFIG, WEIGHTS):
        (speculators_dir / stale).unlink(missing_ok=True)
    speculators_dir.mkdir(parents=True, exist_ok=True)
    title = "# No speculators format for this draft\n\n"
    (speculators_dir / SPECULATORS_README).write_text(title + _NO_SPECULATORS_FORM[why])


def _write(directory: Path, config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    """Weights, then config, each renamed into place when complete; nothing else in the directory is touched (the
    report stage owns the model card next to them). A kill between the two leaves new weights beside the old
    config: DVC then sees the stage unfinished and reruns it."""
    with atomic_path(directory / WEIGHTS) as partial:
        save_file(tensors, str(partial), metadata={"format": "pt"})
    write_json(directory / CONFIG, config)


def load_exported_draft(draft_dir: Path) -> tuple[Eagle3Draft, torch.Tensor]:
    """A vLLM-format draft as a float32 model (fc's input scale already folded in) and its d2t: its config complete
    and typed, every tensor of the shape the config gives it and the dtype it names, d2t mapping into t2d."""
    path, weights = draft_dir / CONFIG, draft_dir / WEIGHTS
    config = read_json(path, "export the draft first (`dvc repro export`)", _EXPORT_FIX)
    check_fields(path, config, _VLLM_DRAFT, _EXPORT_FIX)
    check_fields(path, config, _EXPORTED, _EXPORT_FIX)
    shape = DraftConfig.from_exported(config)
    if shape.num_attention_heads % shape.num_key_value_heads:
        raise Eagle3Error(
            f"{path}: num_key_value_heads {shape.num_key_value_heads} does not divide num_attention_heads "
            f"{shape.num_attention_heads}; {_EXPORT_FIX}"
        )
    try:
        with torch.device("meta"):
            parameters = dict(Eagle3Draft(shape).named_parameters())
    except (ValueError, TypeError, KeyError, RuntimeError) as exc:
        raise Eagle3Error(f"{path}: does not describe a draft ({str(exc).splitlines()[0]}); {_EXPORT_FIX}") from None
    dtype = DTYPES[config["torch_dtype"]]
    expected = {name: (tuple(parameter.shape), dtype) for name, parameter in parameters.items()}
    expected |= {"d2t": ((shape.draft_vocab_size,), torch.int64), "t2d": ((shape.vocab_size,), torch.bool)}
    tensors = matching_tensors(weights, expected, _EXPORT_FIX)
    d2t, t2d = tensors.pop("d2t"), tensors.pop("t2d")
    problems = _check_vocab_map(d2t, t2d)
    if problems:
        raise Eagle3Error(f"{weights}: {problems[0]}; {_EXPORT_FIX}")
    draft = Eagle3Draft(shape)
    draft.load_state_dict({**{k: v.float() for k, v in tensors.items()}, "aux_scale": torch.ones_like(draft.aux_scale)})
    return draft.eval(), d2t


def _load_config(draft_dir: Path) -> tuple[dict[str, Any], str, list[int] | None, DraftLayout, list[str]]:
    """(layer config, tensor prefix of the decoder layer, aux layer ids, the layout vLLM reads, format-level
    problems)."""
    path = draft_dir / CONFIG
    config = read_json(path, "a draft directory holds config.json and model.safetensors")
    problems = []
    if config.get("speculators_model_type") is not None:
        check_fields(path, config, _SPECULATORS_DRAFT)
        if config["speculators_model_type"] != "eagle3":
            problems.append(f"speculators_model_type is {config['speculators_model_type']!r}, expected 'eagle3'")
        layer = {**(config.get("transformer_layer_config") or {}), "draft_vocab_size": config.get("draft_vocab_size")}
        layout, layout_problems = _layout(config, _SPECULATORS_DEFAULTS)
        problems += layout_problems
        methods = (config.get("speculators_config") or {}).get("proposal_methods") or [{}]
        if not methods[0].get("speculative_tokens"):
            problems.append("speculators_config.proposal_methods[0].speculative_tokens is missing")
        return layer, "layers.0.", config.get("eagle_aux_hidden_state_layer_ids"), layout, problems
    check_fields(path, config, _VLLM_DRAFT)
    architectures = config.get("architectures") or []
    architecture, model_type, accepted = ARCHITECTURES["mla" if config.get("kv_lora_rank") else "llama"]
    if not accepted & set(architectures):
        problems.append(f"architectures is {architectures}, expected [{architecture!r}]")
    if config.get("model_type") != model_type:
        problems.append(f"model_type is {config.get('model_type')!r}, expected {model_type!r}")
    layout, layout_problems = _layout(config, {})
    problems += layout_problems
    aux = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    top_level = config.get("eagle_aux_hidden_state_layer_ids")
    if aux and top_level is None:
        problems.append(
            "eagle_aux_hidden_state_layer_ids is only inside eagle_config: vLLM's V2 model runner reads the top-level "
            "key, and without it captures the verifier's default layers"
        )
    elif aux and top_level != aux:
        problems.append(f"eagle_aux_hidden_state_layer_ids is {top_level} at the top level but {aux} in eagle_config")
    return config, "midlayer.", aux, layout, problems


def _layout(config: dict[str, Any], defaults: dict[str, bool]) -> tuple[DraftLayout, list[str]]:
    """The layout vLLM's loader reads from `config` (a switch left out: `defaults`, else false), and a problem for
    each switch left out where that loader's default is true: which layout was trained is then anyone's guess."""
    problems = [
        f"{key} is missing, and vLLM's speculators loader defaults it to true: write it as the draft was trained"
        for key, default in defaults.items()
        if default and config.get(key) is None
    ]
    return DraftLayout(**{key: config.get(key, defaults.get(key, False)) for key in LAYOUT_KEYS}), problems


def expected_tensors(
    config: dict[str, Any], prefix: str, aux_count: int, layout: DraftLayout
) -> dict[str, tuple[tuple[int, ...], str]]:
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    kv, head_dim = config.get("num_key_value_heads", heads), config.get("head_dim") or hidden // heads
    inter, draft_vocab, vocab = config["intermediate_size"], config["draft_vocab_size"], config["vocab_size"]
    floats = "float"
    shapes = {
        "fc.weight": ((hidden, aux_count * hidden), floats),
        "norm.weight": ((hidden,), floats),
        "lm_head.weight": ((draft_vocab, hidden), floats),
        "d2t": ((draft_vocab,), "int64"),
        "t2d": ((vocab,), "bool"),
    }
    if layout.norm_before_fc:
        shapes["input_norm.weight"] = ((aux_count * hidden,), floats)
    if layout.fc_norm:
        shapes |= {f"fc_norm.{i}.weight": ((hidden,), floats) for i in range(aux_count)}
    attention = (
        _mla_tensors(config, hidden, heads)
        if config.get("kv_lora_rank")
        else {
            "self_attn.q_proj.weight": (heads * head_dim, 2 * hidden),
            "self_attn.k_proj.weight": (kv * head_dim, 2 * hidden),
            "self_attn.v_proj.weight": (kv * head_dim, 2 * hidden),
            "self_attn.o_proj.weight": (hidden, heads * head_dim),
        }
    )
    for name, shape in {
        "input_layernorm.weight": (hidden,),
        "hidden_norm.weight": (hidden,),
        "post_attention_layernorm.weight": (hidden,),
        **attention,
        "mlp.gate_proj.weight": (inter, hidden),
        "mlp.up_proj.weight": (inter, hidden),
        "mlp.down_proj.weight": (hidden, inter),
    }.items():
        shapes[prefix + name] = (shape, floats)
    return shapes


def _mla_tensors(config: dict[str, Any], hidden: int, heads: int) -> dict[str, tuple[int, ...]]:
    """The MLA attention's tensors as vLLM's DeepseekV2MLAAttention loads them (eagle3/modeling/mla_attention.py)."""
    q_rank, rank, v_dim = config["q_lora_rank"], config["kv_lora_rank"], config["v_head_dim"]
    qk_dim, rope = config["qk_nope_head_dim"] + config["qk_rope_head_dim"], config["qk_rope_head_dim"]
    return {
        "self_attn.q_a_proj.weight": (q_rank, 2 * hidden),
        "self_attn.q_a_layernorm.weight": (q_rank,),
        "self_attn.q_b_proj.weight": (heads * qk_dim, q_rank),
        "self_attn.kv_a_proj_with_mqa.weight": (rank + rope, 2 * hidden),
        "self_attn.kv_a_layernorm.weight": (rank,),
        "self_attn.kv_b_proj.weight": (heads * (config["qk_nope_head_dim"] + v_dim), rank),
        "self_attn.o_proj.weight": (hidden, heads * v_dim),
    }


def _dtype_ok(dtype: torch.dtype | None, kind: str) -> bool:
    if kind == "float":
        return dtype in (torch.bfloat16, torch.float16, torch.float32)
    return dtype == {"int64": torch.int64, "bool": torch.bool}[kind]


def check_draft(draft_dir: Path, verifier_dir: Path, trained: DraftLayout | None = None) -> list[str]:
    """Every mismatch between the draft in `draft_dir` and the contract / the verifier, as readable lines; with
    `trained` (export: the checkpoint's layout), also each switch vLLM would read otherwise."""
    config, prefix, aux, layout, problems = _load_config(draft_dir)
    if trained is not None:
        problems += [
            f"{key} reads as {str(getattr(layout, key)).lower()} in vLLM, but the draft was trained with "
            f"{str(getattr(trained, key)).lower()}"
            for key in LAYOUT_KEYS
            if getattr(layout, key) != getattr(trained, key)
        ]
    needed = ("hidden_size", "vocab_size", "num_hidden_layers", "max_position_embeddings")
    verifier = require(verifier_dir / CONFIG, read_config(verifier_dir, _VERIFIER_HINT), needed, _VERIFIER_HINT)
    layers = verifier["num_hidden_layers"]
    # The draft's attention shape is its own (train.attention; an MLA verifier's differs from it by design): it
    # must be consistent in itself and with its tensors, and meet the verifier where they exchange data.
    expect = {"hidden_size": verifier["hidden_size"], "vocab_size": verifier["vocab_size"], "num_hidden_layers": 1}
    shape_problems = [
        f"config {key} is {config.get(key)!r}, the verifier needs {value!r}"
        for key, value in expect.items()
        if config.get(key) != value
    ]
    heads = config.get("num_attention_heads")
    kv_heads = config.get("num_key_value_heads", heads)
    if not (isinstance(heads, int) and isinstance(kv_heads, int) and heads > 0 and kv_heads > 0) or heads % kv_heads:
        shape_problems.append(
            f"config num_key_value_heads {kv_heads!r} must be a positive divisor of num_attention_heads {heads!r}"
        )
    if config.get("kv_lora_rank"):
        shape_problems += [
            f"config {key} is missing: an MLA draft (kv_lora_rank set) needs it"
            for key in MLA_KEYS
            if key != "kv_lora_rank" and not config.get(key)
        ]
    problems += shape_problems
    if config.get("tie_word_embeddings", True):
        problems.append(
            "config tie_word_embeddings must be false (the draft's lm_head is its own, over the draft vocab)"
        )
    if (config.get("max_position_embeddings") or 0) < verifier["max_position_embeddings"]:
        problems.append(
            f"config max_position_embeddings is {config.get('max_position_embeddings')!r}, "
            f"must be >= the verifier's {verifier['max_position_embeddings']}"
        )
    if not aux:
        problems.append(
            "eagle_aux_hidden_state_layer_ids is missing: vLLM would guess the layers and acceptance collapses"
        )
    elif any(not isinstance(k, int) or not 0 <= k < layers for k in aux):
        problems.append(f"eagle_aux_hidden_state_layer_ids {aux} must be ints in [0, {layers})")
    elif aux != sorted(set(aux)):
        problems.append(
            f"eagle_aux_hidden_state_layer_ids {aux} must be distinct and ascending: vLLM concatenates the captured "
            "layers in ascending order, so fc would read them in another order than the one written"
        )
    draft_vocab = config.get("draft_vocab_size")
    if not isinstance(draft_vocab, int) or not 0 < draft_vocab <= verifier["vocab_size"]:
        shape_problems.append(f"config draft_vocab_size is {draft_vocab!r}, must be in (0, {verifier['vocab_size']}]")
        problems += shape_problems[-1:]
    if shape_problems or not isinstance(config.get("intermediate_size"), int):
        return problems + (
            [] if isinstance(config.get("intermediate_size"), int) else ["config intermediate_size is missing"]
        )
    return problems + _tensor_problems(draft_dir, config, prefix, aux, layout)


def _tensor_problems(
    draft_dir: Path, config: dict[str, Any], prefix: str, aux: list[int] | None, layout: DraftLayout
) -> list[str]:
    """The safetensors file against the tensors a config of a consistent shape declares, and the vocab maps."""
    weights = draft_dir / WEIGHTS
    if not weights.is_file():
        return [f"{weights.name} is missing"]
    problems: list[str] = []
    expected = expected_tensors(config, prefix, len(aux or [None] * 3), layout)
    headers = tensor_headers(weights, _DRAFT_FIX)
    for name, (shape, kind) in expected.items():
        if name not in headers:
            problems.append(f"tensor {name} is missing")
            continue
        actual_shape, stored = headers[name]
        if actual_shape != shape:
            problems.append(f"tensor {name} has shape {list(actual_shape)}, expected {list(shape)}")
        elif not _dtype_ok(_SAFETENSORS_DTYPES.get(stored), kind):
            shown = str(_SAFETENSORS_DTYPES[stored]).removeprefix("torch.") if stored in _SAFETENSORS_DTYPES else stored
            problems.append(f"tensor {name} has dtype {shown}, expected {kind}")
    for name in sorted(set(headers) - set(expected)):
        if name.endswith("embed_tokens.weight"):
            continue  # optional: vLLM uses it instead of the verifier's embeddings when present
        problems.append(f"unexpected tensor {name} (vLLM would fail to load it)")
    if not any("d2t" in p or "t2d" in p for p in problems) and {"d2t", "t2d"} <= set(headers):
        # Both of the shape and dtype expected: loading them allocates what the config declares.
        problems += _check_vocab_map(load_tensor(weights, "d2t", _DRAFT_FIX), load_tensor(weights, "t2d", _DRAFT_FIX))
    return problems


def _check_vocab_map(d2t: torch.Tensor, t2d: torch.Tensor) -> list[str]:
    # safetensors stores a bool as a byte: any other than 0 and 1 is no bool that torch (or vLLM) computes with.
    if int(t2d.view(torch.uint8).max()) > 1:
        return ["t2d holds bytes other than 0 (false) and 1 (true)"]
    targets = torch.arange(len(d2t)) + d2t
    if targets.min() < 0 or targets.max() >= len(t2d):
        return [f"d2t maps draft ids outside the verifier vocab [0, {len(t2d)})"]
    problems = []
    if len(torch.unique(targets)) != len(targets):
        problems.append("d2t maps two draft ids to the same target token")
    if int(t2d.sum()) != len(d2t) or not bool(t2d[targets].all()):
        problems.append("t2d does not mark exactly the target tokens that d2t maps to")
    return problems


def validate_draft(draft_dir: Path, verifier_dir: Path, trained: DraftLayout | None = None) -> None:
    problems = check_draft(draft_dir, verifier_dir, trained)
    if problems:
        raise Eagle3Error(f"{draft_dir}: not a valid EAGLE-3 draft for {verifier_dir}: " + "; ".join(problems))
