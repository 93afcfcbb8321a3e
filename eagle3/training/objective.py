"""What training optimises and one optimizer step of it, shared by the train stage and the benchmarks. The DFlash
block draft's objective is eagle3/training/dflash_objective.py; `make_objective` picks the draft's, and `train_step`
steps either.

Objective (SpecForge's, on vLLM's inference path, eagle3/modeling/draft.py): the draft is unrolled `ttt_steps`
times; at step i position t predicts token t+2+i (eagle3/modeling/ttt_alignment.py) and is scored by soft
cross-entropy against the verifier's own next-token distribution there, softmax(lm_head(final hidden))
restricted to the draft vocab, weighted step_weight**i. A position counts when the token it predicts is an
assistant token (loss mask) the draft vocab can express. Each step's loss is averaged over the positions that
count in the whole global batch, so 1 and N processes compute the same loss.

The verifier's pieces (embedding, head rows of the draft vocab) are buffers, not frozen parameters: nothing
shards, synchronises or optimises them, under DDP and FSDP alike (eagle3/training/distributed.py).
"""

import math
from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from eagle3.formats.vocab import draft_to_target
from eagle3.modeling.draft import Eagle3Draft
from eagle3.modeling.drafts import AnyDraft, AnyDraftConfig, draft_for
from eagle3.modeling.ttt_alignment import shift_left, target_offset, verifier_offset
from eagle3.params.train import TrainParams
from eagle3.precision import resolve
from eagle3.training.dflash_objective import DFlashObjective
from eagle3.training.distributed import Dist, gradient_sync
from eagle3.training.frozen_embedding import FrozenEmbedding
from eagle3.training.soft_cross_entropy import soft_cross_entropy


class Objective(nn.Module):
    # Buffers (see __init__): the verifier's head rows of the draft vocab, and which target ids it holds.
    target_head: torch.Tensor
    t2d: torch.Tensor
    """Draft + the frozen verifier pieces the loss needs; one forward = one training-time-test unroll, so DDP and
    FSDP see a single forward per step."""

    def __init__(
        self,
        draft: Eagle3Draft,
        *,
        embed: torch.Tensor,
        draft_lm_head: torch.Tensor,
        t2d: torch.Tensor,
        ttt_steps: int,
        step_weight: float,
        recompute: str = "off",
    ):
        super().__init__()
        self.draft = draft
        self.embed = FrozenEmbedding(embed)
        self.register_buffer("target_head", draft_lm_head, persistent=False)
        self.register_buffer("t2d", t2d, persistent=False)
        self.ttt_steps, self.weights = ttt_steps, [step_weight**i for i in range(ttt_steps)]
        self.recompute = recompute

    @torch.no_grad()
    def distribution(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The verifier's distribution over the draft vocab [B, T, Vd] and its top-1 [B, T]."""
        logits = batch["final"].to(self.target_head.dtype) @ self.target_head.T
        return logits.float().softmax(-1), logits.argmax(-1)

    @torch.no_grad()
    def counted(self, batch: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """Per TTT step, which positions count [B, T]."""
        counts = batch["loss_mask"] & self.t2d[batch["input_ids"]]
        return [shift_left(counts, target_offset(i)) for i in range(self.ttt_steps)]

    def forward(
        self,
        batch: dict[str, torch.Tensor],
        probs: torch.Tensor,
        top1: torch.Tensor,
        masks: list[torch.Tensor],
        global_counts: torch.Tensor,
        world_size: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Returns (loss to backpropagate, per-step loss sums, per-step correct counts) for this process's slice."""
        features = self.draft.unroll(batch["input_ids"], batch["aux"], self.embed, self.ttt_steps, self.recompute)
        tokens = probs.shape[1]
        # Only positions that count go through norm + lm_head: the vocabulary projection is the costliest part.
        counted, rows, sizes = [], [], []
        for i, (step_features, mask) in enumerate(zip(features, masks, strict=True)):
            sequence, position = mask.nonzero(as_tuple=True)
            counted.append(step_features[sequence, position])
            rows.append(sequence * tokens + position + verifier_offset(i))
            sizes.append(len(sequence))
        selected = torch.cat(counted)
        del counted  # the same rows as `selected`: freed before the soft cross-entropy runs
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
        # DDP and FSDP average gradients over processes; the global normalisation above wants their sum.
        return loss * world_size, sums, correct


class TrainingObjective(Protocol):
    """What one optimizer step (train_step) needs of an objective: this module's Objective (EAGLE-3) or
    eagle3/training/dflash_objective.py's. `ttt_steps` is how many positions it scores per sample (TTT steps, or a
    block's predicted slots): the per-position sums and counts have that length."""

    ttt_steps: int

    @property
    def draft(self) -> nn.Module: ...

    def distribution(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]: ...

    def counted(self, batch: dict[str, torch.Tensor]) -> list[torch.Tensor]: ...


def init_draft(
    draft_config: AnyDraftConfig,
    verifier: dict[str, torch.Tensor],
    d2t: torch.Tensor,
    seed: int,
    freeze_lm_head: bool = False,
) -> AnyDraft:
    """A fresh draft, deterministic in `seed`, its lm_head started from the verifier's rows of the draft vocab (and
    kept there with `freeze_lm_head`: no gradient, no AdamW state)."""
    torch.manual_seed(seed)
    draft = draft_for(draft_config)
    draft.init_weights(torch.Generator().manual_seed(seed), verifier["lm_head"][draft_to_target(d2t)])
    draft.lm_head.weight.requires_grad_(not freeze_lm_head)
    return draft


def training_precision(config: TrainParams, device: torch.device) -> str:
    """train.precision resolved for the training device: "bfloat16" (autocast) or "float32"."""
    return resolve(config.precision, device.type)


def make_objective(
    draft: AnyDraft,
    verifier: dict[str, torch.Tensor],
    d2t: torch.Tensor,
    t2d: torch.Tensor,
    config: TrainParams,
    precision: str,
) -> Objective | DFlashObjective:
    """The objective `draft`'s method trains; `precision` as training_precision resolves it: the target head runs
    in it (in bf16 the verifier's logits cost a fraction of fp32's)."""
    head = verifier["lm_head"][draft_to_target(d2t)].to(getattr(torch, precision))
    if not isinstance(draft, Eagle3Draft):
        return DFlashObjective(
            draft,
            embed=verifier["embed"],
            draft_lm_head=head,
            t2d=t2d,
            anchors=config.dflash.anchors,
            decay=config.dflash.slot_weight,
        )
    return Objective(
        draft,
        embed=verifier["embed"],
        draft_lm_head=head,
        t2d=t2d,
        ttt_steps=config.ttt_steps,
        step_weight=config.step_weight,
        recompute=config.activation_checkpointing,
    )


def learning_rate(config: TrainParams, step_index: int, total: int) -> float:
    """Linear warmup, then cosine from learning_rate down to min_learning_rate at the last step."""
    if step_index < config.warmup_steps:
        return config.learning_rate * (step_index + 1) / config.warmup_steps
    progress_ = (step_index - config.warmup_steps) / max(total - config.warmup_steps, 1)
    cosine = 0.5 * (1 + math.cos(math.pi * min(progress_, 1.0)))
    return config.min_learning_rate + (config.learning_rate - config.min_learning_rate) * cosine


def autocast(device: torch.device, precision: str) -> AbstractContextManager:
    if precision not in ("bfloat16", "float32"):
        raise ValueError(f"precision {precision!r}: resolve it first (training_precision)")
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bfloat16")


def clip_gradients(parameters: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_, the norm accumulated in fp64: it then comes out the same to the last fp32 bit
    whether a process holds whole gradients or FSDP's slices of them (summed in another order), so fsdp trains
    what ddp and one process train rather than drifting apart from them step by step. Returns the norm."""
    grads = [p.grad for p in parameters if p.grad is not None]
    local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
    squares = torch.stack([torch.linalg.vector_norm(g, dtype=torch.float64) for g in local]).square().sum()
    if any(isinstance(g, DTensor) for g in grads):
        dist.all_reduce(squares)  # each process holds a slice of every gradient
    norm = squares.sqrt().float()
    scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    for grad in local:
        grad.mul_(scale)
    return norm


class Stepper(Protocol):
    """What one optimizer step needs of the optimizer: a torch optimizer, or the draft's pair of them."""

    def zero_grad(self, set_to_none: bool = True) -> None: ...

    def step(self) -> Any: ...


@dataclass
class StepResult:
    loss: torch.Tensor  # the objective as backpropagated (this process's share, x world size)
    sums: torch.Tensor  # per TTT step: summed soft cross-entropy over this process's counted positions
    correct: torch.Tensor  # per TTT step: top-1 agreements with the verifier there
    counts: torch.Tensor  # per TTT step: counted positions over all processes


def train_step(
    model: nn.Module,
    objective: TrainingObjective,
    optimizer: Stepper,
    micro: list[dict[str, torch.Tensor]],
    world: Dist,
    grad_clip: float,
    precision: str,
) -> StepResult:
    """One optimizer step on this process's micro-batches of one global batch (already on the device; every
    process has as many); `model` is `objective` or its DDP wrapper; `precision` resolved (training_precision).
    Each micro-batch's gradients add to the last one's: the loss is normalised by the positions that count in the
    whole global batch, so the step is the same however the batch was cut."""
    # Before the forward, so the last step's gradients are not kept beside this step's activations.
    optimizer.zero_grad(set_to_none=True)
    masks = [objective.counted(batch) for batch in micro]
    counted = [torch.stack([m[i].sum() for m in masks]).sum() for i in range(objective.ttt_steps)]
    counts = world.all_sum(torch.stack(counted).float())
    loss: torch.Tensor | None = None
    sums: torch.Tensor | None = None
    correct: torch.Tensor | None = None
    for number, (batch, batch_masks) in enumerate(zip(micro, masks, strict=True)):
        probs, top1 = objective.distribution(batch)
        with gradient_sync(model, last=number == len(micro) - 1), autocast(world.device, precision):
            part, part_sums, part_correct = model(batch, probs, top1, batch_masks, counts, world.size)
        part.backward()
        del probs, top1
        loss = part.detach() if loss is None else loss + part.detach()
        sums = part_sums if sums is None else sums + part_sums
        correct = part_correct if correct is None else correct + part_correct
    assert loss is not None and sums is not None and correct is not None  # every process has a micro-batch
    clip_gradients(objective.draft.parameters(), grad_clip)
    optimizer.step()
    return StepResult(loss, sums, correct, counts)
