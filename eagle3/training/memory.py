"""Training memory without a GPU: the peak bytes of one real training step, counted on fake tensors.

`PeakBytes` counts the storage that the ops run under it allocate, as long as any reference to it (the autograd
graph's included) is alive: on real tensors it is the CPU's missing allocator statistic; on PyTorch's fake tensors
(`FakeTensorMode`: shapes and dtypes, no data) it is the same count for shapes this machine could never hold.

`Estimator` builds the draft, the objective and the optimizer (train.optimizer) as the train stage does
(eagle3/training/objective.py, eagle3/training/optimizers.py) on fake tensors, and runs the real `train_step` once,
the optimizer's state already made as in every step after the first. The batch is made here: the loss mask leaves
out the first ttt_steps + 1 positions of each sequence, so every TTT step counts the same T - ttt_steps - 1
positions per sequence and the one data-dependent op, `nonzero`, is answered with that count (`KnownNonzero`). A
DFlash block draft (train.draft_method dflash) steps its own objective (eagle3/training/dflash_objective.py), its
`ttt_steps` the block's B - 1 predicted slots: every anchor's every slot counts, the costliest case.
What one process holds at the step's peak (`StepMemory`):

    weights, optimizer   the draft's fp32 parameters and the optimizer's state (AdamW: two moments; muon: one
                         for the matrices): replicated under ddp, split over the processes under fsdp (each
                         holds ceil(rows / processes) rows of every tensor)
    gradient_buckets     ddp with several processes: DDP's own copy of the gradients, kept for its all-reduce
    gathered             fsdp with several processes: the parameters gathered whole for the step
    frozen               the verifier's embedding and head rows, and the draft's buffers
    batch                the batch on the device
    step                 the peak of what the step allocates on top: activations, the autograd graph,
                         gradients (fsdp's before they are reduce-scattered), temporaries

The kernels are the CPU's (CUDA's attention kernels keep the same tensors, plus a few bytes of random state);
the CUDA caching allocator's slack and context come on top on a GPU.
"""

import math
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from eagle3.errors import Eagle3Error
from eagle3.formats.hf_config import text_config
from eagle3.formats.provenance import default_aux_layer_ids
from eagle3.modeling.dflash import DFlashConfig, DFlashDraft
from eagle3.modeling.draft import Eagle3Draft
from eagle3.modeling.drafts import AnyDraftConfig, training_config
from eagle3.params.train import TrainParams
from eagle3.training.dflash_objective import DFlashObjective
from eagle3.training.distributed import Dist
from eagle3.training.objective import Objective, train_step
from eagle3.training.optimizers import make_optimizer

GiB = 1 << 30


class PeakBytes(TorchDispatchMode):
    """Peak bytes of tensor storage allocated by the ops run under it; a storage counts until the last reference
    to it, the autograd graph's included, is gone. Storage of `existing` tensors (and so their views) is not
    counted: only what the code under the mode adds."""

    def __init__(self, existing: Iterable[torch.Tensor] = ()):
        super().__init__()
        self.live, self.peak = 0, 0
        self.storages: set[int] = set()
        for tensor in existing:
            self._add(tensor.untyped_storage(), counted=False)

    def _free(self, key: int, size: int) -> None:
        self.storages.discard(key)
        self.live -= size

    def _add(self, storage: torch.UntypedStorage, counted: bool = True) -> None:
        # The storage object's address, not its data pointer: fake storages have no data.
        key, size = storage._cdata, storage.nbytes()
        if key in self.storages:
            return
        self.storages.add(key)
        size = size if counted else 0
        self.live += size
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._free, key, size)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor) and tensor.untyped_storage().nbytes():
                self._add(tensor.untyped_storage())
        return out


class KnownNonzero(TorchDispatchMode):
    """Answers `nonzero` of a 2-D mask with `counts[shape]` true entries per row: what the estimator's masks hold
    ([rows, tokens] per TTT step; a block draft's [rows, anchors] per slot), which fake tensors cannot know."""

    def __init__(self, counts: dict[tuple[int, int], int]):
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.nonzero.default:
            shape = tuple(args[0].shape)
            if shape not in self.counts:
                raise RuntimeError(f"nonzero of a {list(shape)} tensor: only of masks shaped {sorted(self.counts)}")
            return torch.empty((shape[0] * self.counts[shape], 2), dtype=torch.int64, device=args[0].device)
        return func(*args, **(kwargs or {}))


def sample_batch(config: AnyDraftConfig, rows: int, tokens: int, ttt_steps: int) -> dict[str, torch.Tensor]:
    """A batch as the train stage's collate makes it, whose loss mask leaves out the first ttt_steps + 1 positions
    (every TTT step then counts tokens - ttt_steps - 1 per sequence); random ids and states."""
    generator = torch.Generator().manual_seed(0)
    hidden, layers = config.hidden_size, len(config.aux_layer_ids)
    return {
        "input_ids": torch.randint(0, config.vocab_size, (rows, tokens), generator=generator),
        "loss_mask": (torch.arange(tokens) > ttt_steps).expand(rows, tokens).contiguous(),
        "aux": torch.randn(rows, tokens, layers * hidden, generator=generator).to(torch.bfloat16),
        "final": torch.randn(rows, tokens, hidden, generator=generator).to(torch.bfloat16),
    }


def counted_positions(tokens: int, ttt_steps: int) -> int:
    """Positions per sequence each TTT step counts in `sample_batch`."""
    return max(0, tokens - ttt_steps - 1)


def make_objective_for(
    config: AnyDraftConfig,
    ttt_steps: int,
    recompute: str,
    precision: str,
    device: str | torch.device = "cpu",
    anchors: int = TrainParams().dflash.anchors,
) -> Objective | DFlashObjective:
    """The objective as make_objective builds it, from random weights: every token in the draft vocab (every
    position counts, the costliest case), the head in the training precision; a block draft's with `anchors`
    blocks per sequence (its ttt_steps are its block's predicted slots; it recomputes nothing). Built on `device`
    directly: at Kimi-K2.5's shape the draft and the verifier's embedding are ~6 GB, too slow to make on a CPU and
    copy."""
    generator = torch.Generator(device=device).manual_seed(1)
    hidden = config.hidden_size
    with torch.device(device):
        embed = torch.randn(config.vocab_size, hidden, generator=generator).to(torch.bfloat16)
        head = torch.randn(config.draft_vocab_size, hidden, generator=generator).to(getattr(torch, precision))
        t2d = torch.ones(config.vocab_size, dtype=torch.bool)
        if isinstance(config, DFlashConfig):
            if (ttt_steps, recompute) != (config.block_size - 1, "off"):
                raise ValueError(
                    f"a block of {config.block_size} trains {config.block_size - 1} slots, recomputing off"
                )
            decay = TrainParams().dflash.slot_weight
            draft = DFlashDraft(config)
            return DFlashObjective(draft, embed=embed, draft_lm_head=head, t2d=t2d, anchors=anchors, decay=decay)
        return Objective(
            Eagle3Draft(config),
            embed=embed,
            draft_lm_head=head,
            t2d=t2d,
            ttt_steps=ttt_steps,
            step_weight=TrainParams().step_weight,
            recompute=recompute,
        )


def _bytes(tensors: Iterable[torch.Tensor]) -> int:
    storages = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def _share_bytes(tensors: Iterable[torch.Tensor], processes: int) -> int:
    """Bytes per process of `tensors` split along their first dimension as FSDP2 splits them (padded evenly)."""
    total = 0
    for tensor in tensors:
        if tensor.dim() == 0:
            total += tensor.element_size()
            continue
        rows = tensor.shape[0]
        total += math.ceil(rows / processes) * (tensor.numel() // max(rows, 1)) * tensor.element_size()
    return total


@dataclass(frozen=True)
class StepMemory:
    """Bytes one process holds at the peak of a training step (the module docstring says what each part is)."""

    tokens: int
    ttt_steps: int
    recompute: str
    processes: int
    sharding: str
    weights: int
    optimizer: int
    gradient_buckets: int
    gathered: int
    frozen: int
    batch: int
    step: int

    @property
    def persistent(self) -> int:
        """What stays between steps."""
        return self.weights + self.optimizer + self.gradient_buckets + self.frozen

    @property
    def total(self) -> int:
        return self.persistent + self.gathered + self.batch + self.step


class Estimator:
    """One draft shape on fake tensors, stepped at any length and recompute setting (the module docstring)."""

    def __init__(
        self,
        config: AnyDraftConfig,
        ttt_steps: int,
        precision: str = "bfloat16",
        optimizer: str = "adamw",
        freeze_lm_head: bool = False,
        anchors: int = TrainParams().dflash.anchors,
    ):
        from torch._subclasses.fake_tensor import FakeTensorMode

        self.config, self.ttt_steps, self.precision, self.anchors = config, ttt_steps, precision, anchors
        self.fake = FakeTensorMode()
        with self.fake:
            self.objective = make_objective_for(config, ttt_steps, "off", precision, anchors=anchors)
            self.objective.draft.lm_head.weight.requires_grad_(not freeze_lm_head)
            self.optimizer = make_optimizer(self.objective.draft, TrainParams(optimizer=optimizer))
            # The optimizer makes its state at its first step; every later step starts with it.
            for param in self.objective.draft.parameters():
                if param.requires_grad:
                    param.grad = torch.zeros_like(param)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.parameters = list(self.objective.draft.parameters())
        self.states = [t for state in self.optimizer.state.values() for t in state.values()]

    def step_bytes(self, tokens: int, recompute: str, rows: int = 1) -> tuple[int, int]:
        """(bytes of the batch, peak bytes one train_step allocates on top of what exists before it)."""
        with self.fake:
            batch = sample_batch(self.config, rows, tokens, self.ttt_steps)
            self.objective.recompute = recompute
            existing = [*self.objective.parameters(), *self.objective.buffers(), *self.states, *batch.values()]
            if isinstance(self.objective, DFlashObjective):
                counts = {(rows, self.anchors): self.anchors}
            else:
                counts = {(rows, tokens): counted_positions(tokens, self.ttt_steps)}
            with KnownNonzero(counts), PeakBytes(existing) as meter:
                train_step(self.objective, self.objective, self.optimizer, [batch], Dist(), 1.0, self.precision)
        return _bytes(batch.values()), meter.peak

    def memory(
        self, tokens: int, recompute: str, processes: int = 1, sharding: str = "ddp", rows: int = 1
    ) -> StepMemory:
        batch, step = self.step_bytes(tokens, recompute, rows)
        return self.split(tokens, recompute, batch, step, processes, sharding)

    def longest_within(self, limit: int, recompute: str, near: int) -> int:
        """The longest sample (tokens) whose step fits in `limit` bytes, 0 if none does. The peak is monotone in
        length but not a straight line (which tensors meet at the peak changes with length and precision), so this
        searches the estimate itself: from `near` (a length to start at), doubling or halving to a bracket, then
        bisecting it."""

        def fits(tokens: int) -> bool:
            return self.memory(tokens, recompute).total <= limit

        shortest = self.ttt_steps + 2  # a shorter sample has no position that every TTT step counts
        if not fits(shortest):
            return 0
        start = max(shortest, near)
        if fits(start):
            fitting, beyond = start, start * 2
            while fits(beyond):
                fitting, beyond = beyond, beyond * 2
        else:
            fitting, beyond = max(shortest, start // 2), start
            while not fits(fitting):
                fitting, beyond = max(shortest, fitting // 2), fitting
        while beyond - fitting > 1:
            middle = (fitting + beyond) // 2
            fitting, beyond = (middle, beyond) if fits(middle) else (fitting, middle)
        return fitting

    def split(self, tokens: int, recompute: str, batch: int, step: int, processes: int, sharding: str) -> StepMemory:
        """The parts one of `processes` holds, from one measured step (the same for every process count)."""
        weights, optimizer = _bytes(self.parameters), _bytes(self.states)
        sharded = sharding == "fsdp" and processes > 1
        if sharded:
            gathered = weights
            weights, optimizer = _share_bytes(self.parameters, processes), _share_bytes(self.states, processes)
        else:
            gathered = 0
        frozen = _bytes(self.objective.buffers())
        trained = [p for p in self.parameters if p.requires_grad]
        buckets = _bytes(trained) if sharding == "ddp" and processes > 1 else 0
        return StepMemory(
            tokens,
            self.ttt_steps,
            recompute,
            processes,
            sharding,
            weights,
            optimizer,
            buckets,
            gathered,
            frozen,
            batch,
            step,
        )


def draft_config_for(
    verifier_config: dict[str, Any], draft_vocab: int, train: TrainParams | None = None, aux_layers: int | None = None
) -> AnyDraftConfig:
    """The draft the train stage shapes for this verifier config with these train settings (the defaults: the
    attention and MLP derived from the verifier), on vLLM's default aux layers, or on `aux_layers` of them
    (extract.aux_layer_ids: only their number shapes the draft)."""
    layers = text_config(verifier_config).get("num_hidden_layers")
    if not isinstance(layers, int):
        raise Eagle3Error("verifier config.json: missing 'num_hidden_layers', needed to shape the draft")
    aux_layer_ids = tuple(default_aux_layer_ids(layers)) if aux_layers is None else tuple(range(1, aux_layers + 1))
    return training_config(verifier_config, aux_layer_ids, draft_vocab, train or TrainParams())
