"""Which method an exported draft's config.json is served with, and where it names the verifier layers it reads:
the facts both formats (eagle3/formats/exported_draft.py, eagle3/formats/exported_dflash.py) and their readers
(validate-draft, the lineage report, the model card) share, without loading either model."""

from typing import Any

from eagle3.params.train import DraftMethod

# vLLM's architecture name for a DFlash block draft (model_executor/models/qwen3_dflash.py).
DFLASH_ARCHITECTURE = "DFlashDraftModel"


def exported_method(config: dict[str, Any]) -> DraftMethod:
    """The method vLLM serves an exported draft's config.json with."""
    return "dflash" if DFLASH_ARCHITECTURE in (config.get("architectures") or []) else "eagle3"


def aux_layer_key(config: dict[str, Any]) -> str:
    """Where an exported draft's config.json names the verifier layers it reads (vLLM ids): top level in DFlash's
    format, inside eagle_config in EAGLE-3's."""
    prefix = "" if exported_method(config) == "dflash" else "eagle_config."
    return prefix + "eagle_aux_hidden_state_layer_ids"


def aux_layer_ids(config: dict[str, Any]) -> list[int] | None:
    """The verifier layers an exported draft reads (vLLM ids), from either format; None where missing."""
    found: Any = config
    for part in aux_layer_key(config).split("."):
        found = found.get(part) if isinstance(found, dict) else None
    return found
