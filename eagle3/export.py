"""Stage `export`: the trained draft as vLLM loads it, plus a speculators-format variant.

models/draft/ (vLLM's classic EAGLE-3 format, llama_eagle3.py):
  config.json        LlamaForCausalLMEagle3, num_hidden_layers 1, vocab_size = the verifier's, draft_vocab_size,
                     hidden/heads/KV heads/head_dim/rope from the verifier, max_position_embeddings = the
                     verifier's, tie_word_embeddings false, eagle_config.eagle_aux_hidden_state_layer_ids ALWAYS
                     written (without it vLLM guesses other layers and acceptance collapses to ~1%)
  model.safetensors  fc, midlayer.*, norm, lm_head in export.dtype; d2t int64, t2d bool; no embed_tokens
                     (vLLM shares the verifier's)
models/draft-speculators/: the same tensors (midlayer.* named layers.0.*) with a speculators config
  (speculators_model_type eagle3, norm_before_residual false written explicitly: its default there is true).

Export ends by validating both directories against the verifier (eagle3/validate.py).
"""

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from eagle3.errors import Eagle3Error
from eagle3.files import dumps
from eagle3.layout import CHECKPOINT_DIR, DRAFT_DIR, SPECULATORS_DRAFT_DIR, read_provenance, verifier_dir
from eagle3.model import DraftConfig, Eagle3Draft
from eagle3.params.export import ExportParams
from eagle3.progress import step
from eagle3.train import latest_checkpoint
from eagle3.validate import validate_draft
from eagle3.vocab import load_vocab

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def vllm_config(config: DraftConfig, dtype: str) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
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
        "norm_before_residual": False,
        "torch_dtype": dtype,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(config.aux_layer_ids), "use_aux_hidden_state": True},
        **config.rope,
    }


def speculators_config(config: DraftConfig, dtype: str, provenance: dict[str, Any], tokens: int) -> dict[str, Any]:
    layer = {key: value for key, value in vllm_config(config, dtype).items()
             if key not in ("architectures", "eagle_config", "draft_vocab_size", "norm_before_residual", "torch_dtype")}
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": tokens}],
            "verifier": {"name_or_path": provenance["name"], "architectures": provenance["architectures"]},
        },
        "transformer_layer_config": layer,
        "draft_vocab_size": config.draft_vocab_size,
        "target_hidden_size": config.hidden_size,
        "norm_before_residual": False,
        "eagle_aux_hidden_state_layer_ids": list(config.aux_layer_ids),
        "torch_dtype": dtype,
    }


def run(params, root: Path, options=None) -> None:
    config: ExportParams = params.export
    provenance = read_provenance(root)
    checkpoint = latest_checkpoint(root / CHECKPOINT_DIR)
    if checkpoint is None:
        raise Eagle3Error(f"{root / CHECKPOINT_DIR}: no checkpoint; run `dvc repro train` (or `eagle3 train`) first")
    state = json.loads((checkpoint / "state.json").read_text(encoding="utf-8"))
    if state["step"] != state["total_steps"]:
        raise Eagle3Error(f"{checkpoint}: training stopped at step {state['step']} of {state['total_steps']}; "
                          "rerun `eagle3 train` to finish it before exporting")
    draft_config = DraftConfig.from_json(state["draft_config"])
    draft = Eagle3Draft(draft_config)
    draft.load_state_dict(load_file(str(checkpoint / "model.safetensors")))
    d2t, t2d = load_vocab(root)
    write_drafts(draft, d2t, t2d, config, provenance, root / DRAFT_DIR, root / SPECULATORS_DRAFT_DIR)
    for directory in (root / DRAFT_DIR, root / SPECULATORS_DRAFT_DIR):
        validate_draft(directory, verifier_dir(root))
    step(f"export: {checkpoint.name} -> {DRAFT_DIR} (vLLM EAGLE-3) and {SPECULATORS_DRAFT_DIR} (speculators); "
         f"aux layers {list(draft_config.aux_layer_ids)}, draft vocab {draft_config.draft_vocab_size}")


def write_drafts(draft: Eagle3Draft, d2t: torch.Tensor, t2d: torch.Tensor, config: ExportParams,
                 provenance: dict[str, Any], vllm_dir: Path, speculators_dir: Path) -> None:
    tensors = {**draft.export_state(DTYPES[config.dtype]), "d2t": d2t.to(torch.int64), "t2d": t2d.to(torch.bool)}
    _write(vllm_dir, vllm_config(draft.config, config.dtype), tensors)
    renamed = {name.replace("midlayer.", "layers.0.", 1): tensor for name, tensor in tensors.items()}
    _write(speculators_dir, speculators_config(draft.config, config.dtype, provenance, config.num_speculative_tokens),
           renamed)


def _write(directory: Path, config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    """Each file is written beside its final name and renamed into place; nothing else in the directory is touched
    (the report stage owns the model card next to them)."""
    directory.mkdir(parents=True, exist_ok=True)
    config_partial, weights_partial = directory / ".config.json.partial", directory / ".model.safetensors.partial"
    config_partial.write_text(dumps(config), encoding="utf-8")
    save_file(tensors, str(weights_partial), metadata={"format": "pt"})
    weights_partial.replace(directory / "model.safetensors")
    config_partial.replace(directory / "config.json")
