"""Stage `export`: the trained draft as vLLM loads it, plus a speculators-format variant.

Reads the newest checkpoint (which must be the last training step), writes models/draft/ and
models/draft-speculators/ (format: eagle3/formats/exported_draft.py; for the MLA layer only a README saying why) and
validates each draft against the verifier. A DFlash block draft is written in vLLM's `dflash` format
(eagle3/formats/exported_dflash.py), its speculators directory a README saying why it holds none.
"""

from pathlib import Path

import torch

from eagle3.errors import Eagle3Error
from eagle3.formats.checkpoints import latest_checkpoint, load_draft
from eagle3.formats.exported_dflash import validate_dflash, write_dflash
from eagle3.formats.exported_draft import has_speculators_form, no_speculators_form, validate_draft, write_drafts
from eagle3.formats.provenance import Provenance, read_provenance, verifier_dir
from eagle3.formats.vocab import load_vocab
from eagle3.modeling.dflash import DFlashDraft
from eagle3.modeling.draft import Eagle3Draft
from eagle3.modeling.drafts import AnyDraft, method_of
from eagle3.params.base import StageParams
from eagle3.params.export import ExportParams
from eagle3.params.train import TrainParams
from eagle3.paths import CHECKPOINT_DIR, DRAFT_DIR, SPECULATORS_DRAFT_DIR
from eagle3.progress import status


class Params(StageParams):
    export: ExportParams = ExportParams()
    # Its draft_method, draft_layer and draft_layout: a checkpoint of another is not exported as this one.
    train: TrainParams = TrainParams()


def run(params: Params, root: Path, options=None) -> None:
    checkpoint = latest_checkpoint(root / CHECKPOINT_DIR)
    if checkpoint is None:
        raise Eagle3Error(f"{root / CHECKPOINT_DIR}: no checkpoint; run `dvc repro train` (or `eagle3 train`) first")
    draft, state = load_draft(checkpoint)
    check_trained_as_configured(checkpoint, draft, params.train)
    if state.step != state.total_steps:
        raise Eagle3Error(
            f"{checkpoint}: training stopped at step {state.step} of {state.total_steps}; "
            "rerun `eagle3 train` to finish it before exporting"
        )
    provenance = read_provenance(root)
    d2t, t2d = load_vocab(root, provenance.vocab_size)
    if isinstance(draft, DFlashDraft):
        export_block_draft(root, checkpoint, draft, d2t, params.export)
    else:
        export_chain_draft(root, checkpoint, draft, d2t, t2d, params.export, provenance)


def check_trained_as_configured(checkpoint: Path, draft: AnyDraft, train: TrainParams) -> None:
    """A checkpoint of another method, draft layer or layout is not exported as the configured one."""
    if method_of(draft.config) != train.draft_method:
        raise Eagle3Error(
            f"{checkpoint}: a {method_of(draft.config)} draft, not train.draft_method's {train.draft_method}; "
            "rerun `dvc repro train` with this method first"
        )
    if not isinstance(draft, Eagle3Draft):
        return
    if draft.config.draft_layer != train.draft_layer:
        raise Eagle3Error(
            f"{checkpoint}: a {draft.config.draft_layer} draft layer, not train.draft_layer's "
            f"{train.draft_layer}; rerun `dvc repro train` with this layer first"
        )
    if draft.config.layout != train.draft_layout:
        raise Eagle3Error(
            f"{checkpoint}: trained with draft layout {draft.config.layout.words()}, not train.draft_layout's "
            f"{train.draft_layout.words()}; rerun `dvc repro train` with this layout first"
        )


def export_block_draft(
    root: Path, checkpoint: Path, draft: DFlashDraft, d2t: torch.Tensor, config: ExportParams
) -> None:
    write_dflash(draft, d2t, root / DRAFT_DIR, config.dtype)
    validate_dflash(root / DRAFT_DIR, verifier_dir(root))
    no_speculators_form(root / SPECULATORS_DRAFT_DIR, "dflash")
    status(
        f"export: {checkpoint.name} -> {DRAFT_DIR} (vLLM DFlash: decoder layers {draft.config.num_hidden_layers}, "
        f"block {draft.config.block_size}, mask token {draft.config.mask_token_id}); no speculators format "
        f"({SPECULATORS_DRAFT_DIR}/README.md says why); aux layers {list(draft.config.aux_layer_ids)}, draft "
        f"vocab {draft.config.draft_vocab_size}"
    )


def export_chain_draft(
    root: Path,
    checkpoint: Path,
    draft: Eagle3Draft,
    d2t: torch.Tensor,
    t2d: torch.Tensor,
    config: ExportParams,
    provenance: Provenance,
) -> None:
    write_drafts(
        draft,
        d2t,
        t2d,
        root / DRAFT_DIR,
        root / SPECULATORS_DRAFT_DIR,
        dtype=config.dtype,
        num_speculative_tokens=config.num_speculative_tokens,
        verifier_name=provenance.name,
        verifier_architectures=provenance.architectures,
    )
    speculators = has_speculators_form(draft.config)
    for directory in (root / DRAFT_DIR, root / SPECULATORS_DRAFT_DIR)[: 2 if speculators else 1]:
        validate_draft(directory, verifier_dir(root), draft.config.layout)
    also = (
        f"{SPECULATORS_DRAFT_DIR} (speculators)"
        if speculators
        else f"no speculators format for the MLA layer ({SPECULATORS_DRAFT_DIR}/README.md says why)"
    )
    status(
        f"export: {checkpoint.name} -> {DRAFT_DIR} (vLLM EAGLE-3, {draft.config.draft_layer} layer) and {also}; "
        f"aux layers {list(draft.config.aux_layer_ids)}, draft vocab {draft.config.draft_vocab_size}"
    )
