"""What a DFlash block draft (eagle3/modeling/dflash.py) is trained on: blocks at anchors of the verifier's own
answers, every slot scored against the verifier's distribution there.

For each sequence, up to `anchors` positions p are taken among the answer positions (the token after p is an answer
token the draft vocab holds, and p > 0 so there is context), evenly spaced over them from an offset that depends on
the sequence (`anchor_positions`: a pure function of the batch, so a resumed run takes the same anchors). The block
at p is [x_p, mask, ...] over the context before p; slot i (1..B-1) predicts the token at p+i and is scored by soft
cross-entropy against the verifier's next-token distribution at p+i-1, softmax(lm_head(final hidden)) restricted to
the draft vocab, weighted decay**(i-1). A slot counts where the token it predicts is an answer token the draft vocab
holds. Each slot's loss is averaged over the slots that count in the whole global batch, as the EAGLE-3 objective
averages each TTT step's (eagle3/training/objective.py): `ttt_steps` here is the block's B-1 predicted slots, so the
training step, the logged per-position accuracies and the checkpoints are the same machinery for both.
"""

import torch
from torch import nn

from eagle3.modeling.dflash import DFlashDraft
from eagle3.training.frozen_embedding import FrozenEmbedding
from eagle3.training.soft_cross_entropy import soft_cross_entropy


def anchor_positions(batch: dict[str, torch.Tensor], count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([B, N] anchor positions, [B, N] which are real) for `count` anchors per sequence (N = count; sequences with
    fewer eligible positions pad with position 1, not real). Tensor operations only, no value read back: the same on
    fake tensors (the memory estimate) and without a device sync on a GPU."""
    ids, loss_mask = batch["input_ids"], batch["loss_mask"]
    tokens = ids.shape[1]
    eligible = torch.zeros_like(loss_mask)
    eligible[:, 1 : tokens - 1] = loss_mask[:, 2:]  # the token after p is an answer token; p > 0
    found = eligible.sum(1)  # [B]
    taken = found.clamp(max=count)
    # Evenly spaced over the eligible positions: pick j is the floor(offset + j * stride)-th of them, stride in
    # float32 as the picks are computed.
    stride = (found.double() / taken.clamp(min=1).double()).float()
    # An offset within the first stride that the sequence itself decides: anchors differ between sequences.
    offset = ids[:, : min(tokens, 16)].sum(1) % stride.double().floor().long().clamp(min=1)
    slots = torch.arange(count, device=ids.device)
    picks = (offset[:, None] + slots * stride[:, None]).long().clamp(max=(found - 1).clamp(min=0)[:, None])
    # The pick-th eligible position: where the running count of eligible positions first exceeds pick.
    running = eligible.long().cumsum(1)
    anchors = torch.searchsorted(running, picks + 1)
    real = slots[None, :] < taken[:, None]
    return torch.where(real, anchors, torch.ones_like(anchors)), real


class DFlashObjective(nn.Module):
    """The block draft + the frozen verifier pieces the loss needs; one forward = every anchor's block."""

    target_head: torch.Tensor
    t2d: torch.Tensor

    def __init__(
        self,
        draft: DFlashDraft,
        *,
        embed: torch.Tensor,
        draft_lm_head: torch.Tensor,
        t2d: torch.Tensor,
        anchors: int,
        decay: float,
    ):
        super().__init__()
        self.draft = draft
        self.embed = FrozenEmbedding(embed)
        self.register_buffer("target_head", draft_lm_head, persistent=False)
        self.register_buffer("t2d", t2d, persistent=False)
        self.anchors = anchors
        self.ttt_steps = draft.config.block_size - 1  # the slots that predict: 1..B-1
        self.weights = [decay**i for i in range(self.ttt_steps)]
        self.recompute = "off"

    @torch.no_grad()
    def distribution(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The verifier's distribution over the draft vocab [B, N, B-1, Vd] and its top-1 [B, N, B-1] where the
        blocks need it: for anchor n's slot i, at p+i-1 (the verifier's guess for the token at p+i). Only these
        rows: at a 16K-token sample and a 163,840-token vocabulary every position's would be 10.7 GB in fp32."""
        anchors, _ = anchor_positions(batch, self.anchors)
        final = batch["final"]
        scored = (anchors[:, :, None] + torch.arange(self.ttt_steps, device=anchors.device)).clamp(
            max=final.shape[1] - 1
        )
        rows = final.gather(1, scored.flatten(1)[:, :, None].expand(-1, -1, final.shape[-1]))
        # The vocabulary named: a process's empty share of a batch has no rows to infer it from.
        logits = (rows.to(self.target_head.dtype) @ self.target_head.T).view(*scored.shape, self.target_head.shape[0])
        return logits.float().softmax(-1), logits.argmax(-1)

    @torch.no_grad()
    def counted(self, batch: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """Per predicted slot i (1..B-1), [B, N]: which anchors' slot i counts (its token at p+i is an answer token
        the draft vocab holds)."""
        anchors, real = anchor_positions(batch, self.anchors)
        tokens = batch["input_ids"].shape[1]
        answer = batch["loss_mask"] & self.t2d[batch["input_ids"]]
        masks = []
        for slot in range(1, self.ttt_steps + 1):
            target = anchors + slot
            inside = target < tokens
            masks.append(real & inside & answer.gather(1, target.clamp(max=tokens - 1)))
        return masks

    def forward(
        self,
        batch: dict[str, torch.Tensor],
        probs: torch.Tensor,
        top1: torch.Tensor,
        masks: list[torch.Tensor],
        global_counts: torch.Tensor,
        world_size: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Returns (loss to backpropagate, per-slot loss sums, per-slot correct counts) for this process's slice."""
        anchors, _ = anchor_positions(batch, self.anchors)
        features = self.draft(batch["input_ids"], batch["aux"], anchors, self.embed)  # [B, N, S, H]
        count, slots = anchors.shape[1], self.ttt_steps
        counted, rows, sizes = [], [], []
        for slot, mask in enumerate(masks, start=1):
            sequence, anchor = mask.nonzero(as_tuple=True)
            counted.append(features[sequence, anchor, slot])
            # `distribution`'s row for anchor n's slot: the verifier's distribution at p+slot-1.
            rows.append((sequence * count + anchor) * slots + slot - 1)
            sizes.append(len(sequence))
        selected = torch.cat(counted)
        del counted
        weighted = zip(self.weights, global_counts, strict=True)
        scales = torch.stack([weight / count.clamp(min=1) for weight, count in weighted])
        loss, sums, correct = soft_cross_entropy(
            selected,
            self.draft.norm.weight,
            self.draft.norm.eps,
            self.draft.lm_head.weight,
            probs.view(-1, probs.shape[-1]),
            torch.cat(rows),
            top1.view(-1),
            sizes,
            scales,
        )
        return loss * world_size, sums, correct
