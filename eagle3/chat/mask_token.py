"""The DFlash draft's mask token (train.dflash.mask_token_id null): the token filling a block's slots after the
anchor. The draft learns what its embedding row means there, so it should be a token the verifier's conversations do
not hold: one of the tokenizer's special tokens that is none of bos, eos, pad and unk and that the chat template never
writes (a special token is then in a conversation only where its text spells the token out). Of those, the highest id:
tokenizers list their reserved tokens last."""

from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3.errors import Eagle3Error

if TYPE_CHECKING:
    from eagle3.formats.provenance import Provenance
    from eagle3.params.train import TrainParams


def _template_text(tokenizer: Any) -> str:
    template = getattr(tokenizer, "chat_template", None) or ""
    return "\n".join(template.values()) if isinstance(template, dict) else str(template)


def unused_special_token(tokenizer: Any, vocab_size: int) -> tuple[int, str]:
    """(id, text) of the mask token for this tokenizer, whose model has `vocab_size` embedding rows."""
    named = {getattr(tokenizer, f"{role}_token_id", None) for role in ("bos", "eos", "pad", "unk")} - {None}
    template = _template_text(tokenizer)
    candidates = sorted(
        (token_id, added.content)
        for token_id, added in tokenizer.added_tokens_decoder.items()
        if added.special and token_id not in named and token_id < vocab_size and added.content not in template
    )
    if not candidates:
        raise Eagle3Error(
            "train.dflash.mask_token_id: the verifier's tokenizer has no special token its chat template leaves "
            "unused; set mask_token_id to a token id its conversations never hold"
        )
    return candidates[-1]


def configured_mask_token(root: Path, provenance: "Provenance", train: "TrainParams") -> int:
    """The mask token the draft train.draft_method trains is shaped with: train.dflash.mask_token_id, else for a
    block draft the verifier's unused special token (`unused_special_token`); 0 for a chain draft, which has none."""
    if train.draft_method != "dflash":
        return 0
    if train.dflash.mask_token_id is not None:
        return train.dflash.mask_token_id
    from eagle3.chat.sequence_plan import load_tokenizer

    token_id, _ = unused_special_token(load_tokenizer(root, provenance), provenance.vocab_size)
    return token_id
