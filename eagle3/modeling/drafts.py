"""Which draft a configuration describes: the EAGLE-3 chain draft (eagle3/modeling/draft.py) or the DFlash block
draft (eagle3/modeling/dflash.py), by train.draft_method's name; what the trainer, checkpoints and export build
from either."""

from typing import Any, Literal

from eagle3.modeling.dflash import DFlashConfig, DFlashDraft
from eagle3.modeling.draft import DraftConfig, Eagle3Draft
from eagle3.params.train import TrainParams

AnyDraftConfig = DraftConfig | DFlashConfig
AnyDraft = Eagle3Draft | DFlashDraft


def method_of(config: AnyDraftConfig) -> Literal["eagle3", "dflash"]:
    """train.draft_method's value for the draft `config` describes."""
    return "dflash" if isinstance(config, DFlashConfig) else "eagle3"


def draft_for(config: AnyDraftConfig) -> AnyDraft:
    """The draft `config` describes, on the current default device (the meta device sizes one without memory)."""
    return DFlashDraft(config) if isinstance(config, DFlashConfig) else Eagle3Draft(config)


def training_config(
    verifier_config: dict[str, Any],
    aux_layer_ids: tuple[int, ...],
    draft_vocab_size: int,
    train: TrainParams,
    mask_token_id: int = 0,
) -> AnyDraftConfig:
    """The draft train.draft_method trains for this verifier, shaped as the train params say (a DFlash draft's
    `mask_token_id` shapes nothing: figures that only size the draft leave it at 0)."""
    if train.draft_method == "dflash":
        return DFlashConfig.for_training(verifier_config, aux_layer_ids, draft_vocab_size, train, mask_token_id)
    return DraftConfig.for_training(verifier_config, aux_layer_ids, draft_vocab_size, train)
