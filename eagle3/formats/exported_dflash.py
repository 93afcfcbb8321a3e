"""The exported DFlash block draft: vLLM 0.32's `method: dflash` format (model_executor/models/qwen3_dflash.py),
written and checked here.

models/draft/ for train.draft_method dflash:
  config.json        DFlashDraftModel, model_type qwen3, the draft's shape (hidden, layers, heads, KV heads,
                     head_dim, intermediate_size, hidden_act silu, rms_norm_eps, no attention bias), rope and
                     max_position_embeddings the verifier's (vLLM does not raise a DFlash draft's length to the
                     verifier's: a shorter one stops drafting past it, silently), vocab_size = the verifier's,
                     draft_vocab_size, tie_word_embeddings false, block_size; the captured layers twice, consistently:
                     the top-level eagle_aux_hidden_state_layer_ids (vLLM's ids, which vLLM reads first) and
                     dflash_config.target_layer_ids (DFlash's ids: vLLM's minus one, `target_layer_ids`), with
                     dflash_config.mask_token_id, block_size and causal false (bidirectional blocks)
  model.safetensors  fc.weight [H, A*H], hidden_norm.weight, norm.weight, lm_head.weight [draft_vocab, H],
                     layers.{i}.{input_layernorm, post_attention_layernorm}.weight,
                     layers.{i}.self_attn.{q,k,v,o}_proj.weight, layers.{i}.self_attn.{q,k}_norm.weight,
                     layers.{i}.mlp.{gate,up,down}_proj.weight in export.dtype; d2t int64 [draft_vocab] where the
                     draft vocabulary is pruned (vLLM refuses it for a full one); no embed_tokens (vLLM shares the
                     verifier's, the mask token's row included)

vLLM's DFlash loader reports no missing weight (a layer left out would serve uninitialised memory), so `check_dflash`
checks the whole tensor set against the config before anyone serves it.
"""

from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from eagle3.errors import Eagle3Error
from eagle3.files import atomic_path, write_json
from eagle3.formats.exported_method import DFLASH_ARCHITECTURE, exported_method
from eagle3.formats.hf_config import CONFIG, read_config
from eagle3.modeling.dflash import DFlashConfig, DFlashDraft
from eagle3.modeling.rope import ROPE_KEYS

WEIGHTS = "model.safetensors"


def target_layer_ids(aux_layer_ids: tuple[int, ...] | list[int]) -> list[int]:
    """DFlash's ids of the captured layers from vLLM's (id k = HF hidden_states[k], the stream entering layer k):
    DFlash counts the layer whose output it takes, one less."""
    return [layer - 1 for layer in sorted(aux_layer_ids)]


def dflash_vllm_config(config: DFlashConfig, dtype: str) -> dict[str, Any]:
    return {
        "architectures": [DFLASH_ARCHITECTURE],
        "model_type": "qwen3",
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "intermediate_size": config.intermediate_size,
        "hidden_act": "silu",
        "rms_norm_eps": config.rms_norm_eps,
        "attention_bias": False,
        "max_position_embeddings": config.max_position_embeddings,
        "vocab_size": config.vocab_size,
        "draft_vocab_size": config.draft_vocab_size,
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
        "block_size": config.block_size,
        "eagle_aux_hidden_state_layer_ids": sorted(config.aux_layer_ids),
        "dflash_config": {
            "mask_token_id": config.mask_token_id,
            "target_layer_ids": target_layer_ids(config.aux_layer_ids),
            "block_size": config.block_size,
            "causal": False,
        },
        **config.rope,
    }


def expected_tensors(config: DFlashConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor name of the export with its shape (d2t only for a pruned vocabulary)."""
    with torch.device("meta"):
        draft = DFlashDraft(config)
    shapes = {name: tuple(p.shape) for name, p in draft.named_parameters()}
    if config.draft_vocab_size < config.vocab_size:
        shapes["d2t"] = (config.draft_vocab_size,)
    return shapes


def write_dflash(draft: DFlashDraft, d2t: torch.Tensor, directory: Path, dtype: str) -> None:
    """models/draft/ in vLLM's DFlash format, written whole or not at all."""
    config = draft.config
    tensors = draft.export_state(getattr(torch, dtype))
    if config.draft_vocab_size < config.vocab_size:
        tensors["d2t"] = d2t.to(torch.int64).contiguous()
    with atomic_path(directory) as partial:
        partial.mkdir(parents=True)
        save_file(tensors, str(partial / WEIGHTS), metadata={"format": "pt"})
        write_json(partial / CONFIG, dflash_vllm_config(config, dtype))


def is_dflash(draft_dir: Path) -> bool:
    config = draft_dir / CONFIG
    return config.is_file() and exported_method(read_config(draft_dir)) == "dflash"


def exported_config(config: dict[str, Any]) -> DFlashConfig:
    """The draft's shape from its exported config.json (as check_dflash has checked it)."""
    dflash = config["dflash_config"]
    return DFlashConfig(
        hidden_size=config["hidden_size"],
        num_attention_heads=config["num_attention_heads"],
        num_key_value_heads=config["num_key_value_heads"],
        head_dim=config["head_dim"],
        intermediate_size=config["intermediate_size"],
        num_hidden_layers=config["num_hidden_layers"],
        rms_norm_eps=config["rms_norm_eps"],
        vocab_size=config["vocab_size"],
        draft_vocab_size=config.get("draft_vocab_size", config["vocab_size"]),
        max_position_embeddings=config["max_position_embeddings"],
        aux_layer_ids=tuple(config["eagle_aux_hidden_state_layer_ids"]),
        block_size=config["block_size"],
        mask_token_id=dflash["mask_token_id"],
        rope={key: config[key] for key in ROPE_KEYS if config.get(key) is not None},
    )


def load_exported_dflash(draft_dir: Path, verifier_dir: Path) -> tuple[DFlashDraft, torch.Tensor]:
    """The exported block draft as a float32 model, and its d2t (zeros, the identity, for a full vocabulary),
    after check_dflash passes it against the verifier in `verifier_dir`."""
    validate_dflash(draft_dir, verifier_dir)
    draft = DFlashDraft(exported_config(read_config(draft_dir)))
    tensors = load_file(str(draft_dir / WEIGHTS))
    d2t = tensors.pop("d2t", torch.zeros(draft.config.draft_vocab_size, dtype=torch.int64))
    draft.load_state_dict({name: tensor.float() for name, tensor in tensors.items()})
    return draft.eval(), d2t


def check_dflash(draft_dir: Path, verifier_dir: Path) -> list[str]:
    """Every way the export in `draft_dir` would not serve as trained behind the verifier in `verifier_dir`, one
    line each; [] where it serves."""
    config = read_config(draft_dir)
    verifier = read_config(verifier_dir)
    text = verifier.get("text_config") or verifier
    problems = []
    dflash = config.get("dflash_config") or {}
    aux = config.get("eagle_aux_hidden_state_layer_ids")
    if not aux or aux != sorted(aux):
        problems.append(f"eagle_aux_hidden_state_layer_ids must be the captured layers, ascending, not {aux!r}")
    elif dflash.get("target_layer_ids") != target_layer_ids(aux):
        problems.append(
            f"dflash_config.target_layer_ids {dflash.get('target_layer_ids')!r} must be the captured layers less one "
            f"({target_layer_ids(aux)}): vLLM reads the top-level ids first, and another reader the other"
        )
    elif max(aux) > text.get("num_hidden_layers", 0):
        problems.append(f"captured layer {max(aux)} beyond the verifier's {text.get('num_hidden_layers')} layers")
    mask = dflash.get("mask_token_id")
    if not isinstance(mask, int) or not 0 <= mask < text.get("vocab_size", 0):
        problems.append(f"dflash_config.mask_token_id {mask!r} must be a token of the verifier's vocabulary")
    for key in ("vocab_size", "max_position_embeddings"):
        if config.get(key) != text.get(key):
            problems.append(f"{key} {config.get(key)} differs from the verifier's {text.get(key)}")
    if config.get("tie_word_embeddings"):
        problems.append("tie_word_embeddings must be false: the draft has a head of its own")
    if problems:
        return problems
    shaped = exported_config(config)
    expected = expected_tensors(shaped)
    with safe_open(str(draft_dir / WEIGHTS), "pt") as weights:
        found = {name: tuple(weights.get_slice(name).get_shape()) for name in weights.keys()}
    for name, shape in expected.items():
        if name not in found:
            problems.append(f"{WEIGHTS}: {name} missing (vLLM would serve it uninitialised)")
        elif found[name] != shape:
            problems.append(f"{WEIGHTS}: {name} is {list(found[name])}, the config says {list(shape)}")
    problems += [f"{WEIGHTS}: {name} is not a DFlash tensor" for name in sorted(set(found) - set(expected))]
    return problems


def validate_dflash(draft_dir: Path, verifier_dir: Path) -> None:
    problems = check_dflash(draft_dir, verifier_dir)
    if problems:
        raise Eagle3Error(f"{draft_dir}: not a DFlash draft vLLM serves as trained: " + "; ".join(problems))
