"""Stage `export`: the trained draft as vLLM loads it, plus a speculators-format variant.

Reads the newest checkpoint (which must be the last training step), writes models/draft/ and
models/draft-speculators/ (format: eagle3/formats/exported_draft.py; for the MLA layer only a README saying why) and
validates each draft against the verifier.
"""

from pathlib import Path

from eagle3.errors import Eagle3Error
from eagle3.formats.checkpoints import latest_checkpoint, load_draft
from eagle3.formats.exported_draft import has_speculators_form, validate_draft, write_drafts
from eagle3.formats.provenance import read_provenance, verifier_dir
from eagle3.formats.vocab import load_vocab
from eagle3.params.base import StageParams
from eagle3.params.export import ExportParams
from eagle3.params.train import TrainParams
from eagle3.paths import CHECKPOINT_DIR, DRAFT_DIR, SPECULATORS_DRAFT_DIR
from eagle3.progress import status


class Params(StageParams):
    export: ExportParams = ExportParams()
    # Its draft_layout: a checkpoint of another layout is not exported as this one.
    train: TrainParams = TrainParams()


def run(params: Params, root: Path, options=None) -> None:
    config = params.export
    checkpoint = latest_checkpoint(root / CHECKPOINT_DIR)
    if checkpoint is None:
        raise Eagle3Error(f"{root / CHECKPOINT_DIR}: no checkpoint; run `dvc repro train` (or `eagle3 train`) first")
    draft, state = load_draft(checkpoint)
    if draft.config.draft_layer != params.train.draft_layer:
        raise Eagle3Error(
            f"{checkpoint}: a {draft.config.draft_layer} draft layer, not train.draft_layer's "
            f"{params.train.draft_layer}; rerun `dvc repro train` with this layer first"
        )
    if draft.config.layout != params.train.draft_layout:
        raise Eagle3Error(
            f"{checkpoint}: trained with draft layout {draft.config.layout.words()}, not train.draft_layout's "
            f"{params.train.draft_layout.words()}; rerun `dvc repro train` with this layout first"
        )
    if state.step != state.total_steps:
        raise Eagle3Error(
            f"{checkpoint}: training stopped at step {state.step} of {state.total_steps}; "
            "rerun `eagle3 train` to finish it before exporting"
        )
    provenance = read_provenance(root)
    d2t, t2d = load_vocab(root, provenance.vocab_size)
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
