"""train.optimizer: what updates the draft's trained parameters.

adamw: fused AdamW on every one of them (the fused kernel is faster than the per-parameter loop, exists for CPU
and CUDA and is as deterministic, so resume stays exact: benchmarks/train_step.py).
muon: torch.optim.Muon on the hidden matrices (fc and the decoder layer's projections: Nesterov momentum 0.95,
each update orthogonalised by Newton-Schulz and scaled to the size of an AdamW update, `match_rms_adamw`, so
train.learning_rate means the same as with AdamW; weight decay train.muon_weight_decay), and AdamW on the rest
(the norms' weights and the output head, whose rows are vocabulary entries rather than a hidden map). Muon needs a
whole matrix per update, so it trains under ddp or in one process, not under fsdp's slices (params refuse it).

Either is one DraftOptimizer to the training loop, the memory estimate and the checkpoints: `param_groups` (the
loop sets each group's lr), a per-parameter `state`, the state fields each parameter has, and `step`/`zero_grad`.
"""

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from eagle3.formats.checkpoints import CheckpointedOptimizer
from eagle3.params.train import TrainParams

# Per-parameter state each optimizer keeps, by the name a checkpoint stores it under (eagle3/formats/checkpoints.py):
# AdamW's step count (a float32 scalar) and two moments; Muon's momentum. Every field but the step count is a tensor
# shaped and typed as its parameter.
STATE_FIELDS = {"adamw": ("step", "exp_avg", "exp_avg_sq"), "muon": ("momentum_buffer",)}
SCALAR_FIELDS = {"step": 4}
# Newton-Schulz iterations per Muon update: torch.optim.Muon's default, passed explicitly because the plan prices
# them (newton_schulz_flops).
NEWTON_SCHULZ_STEPS = 5


def muon_matrices(draft: nn.Module) -> set[str]:
    """The names of the draft's parameters Muon updates: every trained matrix but the output head."""
    return {
        name for name, p in draft.named_parameters() if p.requires_grad and p.dim() == 2 and name != "lm_head.weight"
    }


def newton_schulz_flops(draft: nn.Module) -> float:
    """FLOPs of one Muon step's orthogonalisation over every matrix it updates, on each process (under ddp every
    rank orthogonalises every matrix). Per iteration on an m x n matrix, m <= n (torch.optim.Muon transposes the
    tall ones): X Xᵀ and the polynomial times X, 2m²n each, and the Gram matrix squared, 2m³."""
    matrices = muon_matrices(draft)
    total = 0.0
    for name, param in draft.named_parameters():
        if name in matrices:
            m, n = sorted(param.shape)
            total += NEWTON_SCHULZ_STEPS * (4 * m * m * n + 2 * m**3)
    return total


def make_optimizer(draft: nn.Module, config: TrainParams) -> "DraftOptimizer":
    trained = [(name, p) for name, p in draft.named_parameters() if p.requires_grad]

    def adamw(params: list[nn.Parameter]) -> torch.optim.AdamW:
        betas = (0.9, config.adam_beta2)
        return torch.optim.AdamW(
            params, lr=config.learning_rate, betas=betas, weight_decay=config.weight_decay, fused=True
        )

    if config.optimizer == "adamw":
        return DraftOptimizer(adamw([p for _, p in trained]))
    matrices = muon_matrices(draft)
    muon = torch.optim.Muon(
        [p for name, p in trained if name in matrices],
        lr=config.learning_rate,
        weight_decay=config.muon_weight_decay,
        momentum=0.95,
        nesterov=True,
        adjust_lr_fn="match_rms_adamw",
        ns_steps=NEWTON_SCHULZ_STEPS,
    )
    rest = adamw([p for name, p in trained if name not in matrices])
    return DraftOptimizer(muon, rest)


class _States(Mapping[torch.Tensor, dict[str, torch.Tensor]]):
    """The per-parameter state of every optimizer in one mapping; `states[param]` is the owner's own dict, so what
    a checkpoint loads into it is what that optimizer steps with."""

    def __init__(self, optimizer: "DraftOptimizer"):
        self.optimizer = optimizer

    def __getitem__(self, param: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.optimizer.owner(param).state[param]

    def get(self, param: torch.Tensor, default: Any = None) -> Any:
        return self.optimizer.owner(param).state.get(param, default) if self.optimizer.owns(param) else default

    def __iter__(self) -> Iterator[torch.Tensor]:
        for optimizer in self.optimizer.optimizers:
            yield from optimizer.state

    def __len__(self) -> int:
        return sum(len(o.state) for o in self.optimizer.optimizers)


class DraftOptimizer(CheckpointedOptimizer):
    """One or two torch optimizers (the module docstring), each owning some of the parameters, stepped together."""

    def __init__(self, *optimizers: torch.optim.Optimizer):
        self.optimizers = optimizers
        self._owner = {id(p): o for o in optimizers for g in o.param_groups for p in g["params"]}
        self.state = _States(self)

    def owns(self, param: torch.Tensor) -> bool:
        return id(param) in self._owner

    def owner(self, param: torch.Tensor) -> torch.optim.Optimizer:
        return self._owner[id(param)]

    def state_fields(self, param: torch.Tensor) -> tuple[str, ...]:
        """The state the owner of `param` keeps for it."""
        return STATE_FIELDS["muon" if isinstance(self.owner(param), torch.optim.Muon) else "adamw"]

    def state_bytes(self, param: torch.Tensor) -> int:
        """What the owner's state for `param` holds once it has stepped (a sharded parameter counts whole)."""
        size = param.numel() * param.element_size()
        return sum(SCALAR_FIELDS.get(field, size) for field in self.state_fields(param))

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [group for optimizer in self.optimizers for group in optimizer.param_groups]

    def step(self) -> None:
        for optimizer in self.optimizers:
            optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)
