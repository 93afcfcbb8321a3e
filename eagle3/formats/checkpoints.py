"""checkpoints/: resumable training state, no pickle.

    run.json                    the run key and settings the checkpoints were made with (eagle3/resume.py)
    step-NNNNNNN/               one per saved step, the newest `keep_checkpoints` kept
        model.safetensors       the draft's state_dict (fp32; `aux_scale` included, vLLM names)
        optimizer.safetensors   the optimizer's state (eagle3/training/optimizers.py), one tensor per
                                "<parameter name>::<state key>" (AdamW's step as [1])
        state.json              {step, total_steps, run_key, and draft_config (an EAGLE-3 draft) or
                                dflash_config (a DFlash block draft)}

A checkpoint directory is written as `.step-NNNNNNN.partial` and renamed once complete, so one with the final
name is always whole. It holds whole tensors whatever the number of processes and train.sharding: under fsdp
every process takes part in gathering the slices (DTensors) before rank 0 writes them, and loading slices each
whole tensor again for the process that reads it, so a run resumes on any number of processes. The step fixes
the data position and the learning rate, so loading the newest checkpoint and continuing ends at the same
weights as an uninterrupted run.

Read back as untrusted (checkpoints travel through remotes): state.json is validated field by field, and every
tensor's name, shape and dtype must be the draft's (for export, the draft its draft_config describes, sized on
the meta device before anything is allocated) or its optimizer state's, checked before the tensors are loaded.
"""

import math
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from safetensors.torch import save_file
from torch.distributed.tensor import DTensor, distribute_tensor

from eagle3.errors import Eagle3Error, field_problem
from eagle3.files import atomic_path, space_for, write_json
from eagle3.formats.tensor_files import matching_tensors
from eagle3.modeling.dflash import DFlashConfig
from eagle3.modeling.draft import DraftConfig, Eagle3Draft
from eagle3.modeling.drafts import AnyDraft, AnyDraftConfig, draft_for, method_of


class CheckpointedOptimizer(Protocol):
    """What checkpoints read of the training's optimizer (eagle3/training/optimizers.py's DraftOptimizer, which
    declares it): its parameters by group, and each one's state by field, which loading fills in place."""

    state: Mapping[torch.Tensor, dict[str, torch.Tensor]]

    @property
    def param_groups(self) -> list[dict[str, Any]]: ...

    def owns(self, param: torch.Tensor) -> bool: ...

    def state_fields(self, param: torch.Tensor) -> tuple[str, ...]: ...

    def state_bytes(self, param: torch.Tensor) -> int: ...


STATE = "state.json"
MODEL = "model.safetensors"
OPTIMIZER = "optimizer.safetensors"
_SIZES = (
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "draft_vocab_size",
    "max_position_embeddings",
)


class CheckpointState(BaseModel):
    """state.json."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)
    step: int = Field(ge=1)
    total_steps: int = Field(ge=1)
    run_key: str
    draft_config: DraftConfig | None = None
    dflash_config: DFlashConfig | None = None

    @model_validator(mode="after")
    def _one_draft(self) -> "CheckpointState":
        if (self.draft_config is None) == (self.dflash_config is None):
            raise ValueError("draft_config: exactly one of draft_config and dflash_config describes the draft")
        return self

    @classmethod
    def of(cls, config: AnyDraftConfig, step: int, total_steps: int, run_key: str) -> "CheckpointState":
        if isinstance(config, DFlashConfig):
            return cls(step=step, total_steps=total_steps, run_key=run_key, dflash_config=config)
        return cls(step=step, total_steps=total_steps, run_key=run_key, draft_config=config)

    @property
    def config(self) -> AnyDraftConfig:
        config = self.draft_config or self.dflash_config
        assert config is not None  # _one_draft
        return config


def _fix(path: Path) -> str:
    return f"delete {path} and rerun `eagle3 train` (it resumes from the checkpoint before, if any)"


def checkpoints(out: Path) -> list[Path]:
    return sorted(p for p in out.glob("step-*") if p.is_dir() and (p / STATE).is_file())


def latest_checkpoint(out: Path) -> Path | None:
    found = checkpoints(out)
    return found[-1] if found else None


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor itself, or a DTensor gathered from every process (a collective: all of them must call it)."""
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach()


def _like(value: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """A whole tensor as `param` holds it: on its device, and sliced as it is when it is a DTensor. Always a copy:
    a tensor read from a checkpoint maps its file, and state kept from it would keep a deleted checkpoint's
    blocks on the disk for as long as training runs (keep_checkpoints deletes the old ones)."""
    if isinstance(param, DTensor):
        return distribute_tensor(value.clone(), param.device_mesh, param.placements)
    return value.to(param.device, copy=True)


def checkpoint_bytes(draft: AnyDraft, optimizer: CheckpointedOptimizer) -> int:
    """The tensor bytes save_checkpoint writes for them once the optimizer has stepped: the draft's state_dict and
    the state each trained parameter's optimizer keeps (its state fields). Taken from the fields, not from the
    state itself, so it is the same before the first step as after, on every process (a sharded tensor counts
    whole), and for a draft on the meta device (the plan's figure)."""
    weights = sum(t.numel() * t.element_size() for t in draft.state_dict().values())
    return weights + sum(optimizer.state_bytes(p) for group in optimizer.param_groups for p in group["params"])


def save_checkpoint(
    out: Path, draft: AnyDraft, optimizer: CheckpointedOptimizer, state: CheckpointState, keep: int, write=True
) -> Path:
    """Every process calls it (sharded tensors are gathered); only where `write` is it written."""
    final = out / f"step-{state.step:07d}"
    model = {k: _whole(v) for k, v in draft.state_dict().items()}
    names = {id(p): n for n, p in draft.named_parameters()}
    tensors = {}
    for group in optimizer.param_groups:
        for param in group["params"]:
            for key, value in optimizer.state.get(param, {}).items():
                value = _whole(value)
                tensors[f"{names[id(param)]}::{key}"] = value.reshape(-1) if value.dim() == 0 else value
    if not write:
        return final
    with atomic_path(final) as partial, space_for(final, checkpoint_bytes(draft, optimizer)):
        partial.mkdir()
        save_file({k: v.contiguous() for k, v in model.items()}, str(partial / MODEL))
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(partial / OPTIMIZER))
        write_json(partial / STATE, state.model_dump(mode="json"))
    for old in checkpoints(out)[:-keep]:
        shutil.rmtree(old)
    return final


def read_state(path: Path) -> CheckpointState:
    file = path / STATE
    try:
        state = CheckpointState.model_validate_json(file.read_bytes())
    except OSError as exc:
        raise Eagle3Error(f"{file}: unreadable ({exc.strerror}); {_fix(path)}") from None
    except ValidationError as exc:
        raise Eagle3Error(f"{file}: {field_problem(exc)}; {_fix(path)}") from None
    problem = _out_of_range(state.config)
    if problem:
        raise Eagle3Error(f"{file}: {problem}; {_fix(path)}")
    if state.step > state.total_steps:
        raise Eagle3Error(f"{file}: step {state.step} is past total_steps {state.total_steps}; {_fix(path)}")
    return state


def _out_of_range(config: AnyDraftConfig) -> str | None:
    """What in a draft's config no draft can have, if anything."""
    key = "dflash_config" if isinstance(config, DFlashConfig) else "draft_config"
    sizes = _SIZES + (("num_hidden_layers", "block_size") if isinstance(config, DFlashConfig) else ())
    for name in sizes:
        if getattr(config, name) < 1:
            return f"{key}.{name} is {getattr(config, name)}, expected at least 1"
    if not config.aux_layer_ids or min(config.aux_layer_ids) < 0:
        return f"{key}.aux_layer_ids is {list(config.aux_layer_ids)}, expected layer ids >= 0"
    if not (math.isfinite(config.rms_norm_eps) and config.rms_norm_eps > 0):
        return f"{key}.rms_norm_eps is {config.rms_norm_eps}, expected a positive number"
    return None


def _shapes(module: torch.nn.Module) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    return {name: (tuple(tensor.shape), tensor.dtype) for name, tensor in module.state_dict().items()}


def load_checkpoint(path: Path, draft: AnyDraft, optimizer: CheckpointedOptimizer | None) -> CheckpointState:
    """Weights into `draft` and the optimizer's state into `optimizer`, on the device the draft is on now (sliced as its
    parameters are under fsdp: every process calls it)."""
    state = read_state(path)
    trained_method, method = method_of(state.config), method_of(draft.config)
    if trained_method != method:
        raise Eagle3Error(
            f"{path}: a {trained_method} draft, not train.draft_method's {method}; a run cannot change its method: "
            f"set it back, or delete {path.parent}"
        )
    if isinstance(draft, Eagle3Draft):
        _same_layer_and_layout(path, state, draft)
    current = draft.state_dict()
    tensors = matching_tensors(path / MODEL, _shapes(draft), _fix(path))
    draft.load_state_dict({name: _like(value, current[name]) for name, value in tensors.items()})
    if optimizer is not None:
        params = {name: p for name, p in draft.named_parameters() if optimizer.owns(p)}
        # Whichever parameters have state (a parameter that never had a gradient has none).
        expected = {
            f"{name}::{field}": ((1,), torch.float32) if field == "step" else (tuple(p.shape), p.dtype)
            for name, p in params.items()
            for field in optimizer.state_fields(p)
        }
        for key, value in matching_tensors(path / OPTIMIZER, expected, _fix(path), every=False).items():
            name, field = key.split("::")
            # As the parameter is (device, slices): fused AdamW refuses state on another device than its parameter.
            param = params[name]
            step_count = field == "step"
            optimizer.state[param][field] = (
                value.reshape(()).to(param.device, copy=True) if step_count else _like(value, param)
            )
    return state


def _same_layer_and_layout(path: Path, state: CheckpointState, draft: Eagle3Draft) -> None:
    # A switch without tensors of its own (norm_output, norm_before_residual) would otherwise load silently.
    trained = state.draft_config
    assert trained is not None  # the same method as the draft's
    if trained.draft_layer != draft.config.draft_layer:
        raise Eagle3Error(
            f"{path}: a {trained.draft_layer} draft layer, not train.draft_layer's "
            f"{draft.config.draft_layer}; a run cannot change its layer: set it back, or delete {path.parent}"
        )
    if trained.layout != draft.config.layout:
        raise Eagle3Error(
            f"{path}: trained with draft layout {trained.layout.words()}, not train.draft_layout's "
            f"{draft.config.layout.words()}; a run cannot change layout: set it back, or delete {path.parent}"
        )


def load_draft(path: Path) -> tuple[AnyDraft, CheckpointState]:
    """The draft saved at a checkpoint (no optimizer), and its state.json."""
    state = read_state(path)
    try:
        with torch.device("meta"):
            expected = _shapes(draft_for(state.config))
    except (ValueError, TypeError, KeyError, RuntimeError) as exc:
        raise Eagle3Error(
            f"{path / STATE}: draft_config does not describe a draft ({str(exc).splitlines()[0]}); {_fix(path)}"
        ) from None
    tensors = matching_tensors(path / MODEL, expected, _fix(path))
    draft = draft_for(state.config)
    draft.load_state_dict(tensors)
    return draft, state
