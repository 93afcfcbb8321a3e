"""checkpoints/: resumable training state, no pickle.

    run.json                    the run key and settings the checkpoints were made with (eagle3/resume.py)
    step-NNNNNNN/               one per saved step, the newest `keep_checkpoints` kept
        model.safetensors       the draft's state_dict (fp32; `aux_scale` included, vLLM names)
        optimizer.safetensors   AdamW's state, one tensor per "<parameter name>::<state key>" (step as [1])
        state.json              {step, total_steps, run_key, draft_config}

A checkpoint directory is written as `.step-NNNNNNN.partial` and renamed once complete, so one with the final
name is always whole. The step fixes the data position and the learning rate, so loading the newest
checkpoint and continuing ends at the same weights as an uninterrupted run.
"""

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from eagle3.files import atomic_path, write_json
from eagle3.modeling.draft import DraftConfig, Eagle3Draft

STATE = "state.json"
MODEL = "model.safetensors"
OPTIMIZER = "optimizer.safetensors"


def checkpoints(out: Path) -> list[Path]:
    return sorted(p for p in out.glob("step-*") if p.is_dir() and (p / STATE).is_file())


def latest_checkpoint(out: Path) -> Path | None:
    found = checkpoints(out)
    return found[-1] if found else None


def save_checkpoint(
    out: Path, draft: Eagle3Draft, optimizer: torch.optim.Optimizer, state: dict[str, Any], keep: int
) -> Path:
    final = out / f"step-{state['step']:07d}"
    with atomic_path(final) as partial:
        partial.mkdir()
        save_file({k: v.detach().contiguous() for k, v in draft.state_dict().items()}, str(partial / MODEL))
        names = {id(p): n for n, p in draft.named_parameters()}
        tensors = {}
        for group in optimizer.param_groups:
            for param in group["params"]:
                for key, value in optimizer.state.get(param, {}).items():
                    tensors[f"{names[id(param)]}::{key}"] = (
                        value.detach().reshape(-1) if value.dim() == 0 else value.detach()
                    )
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(partial / OPTIMIZER))
        write_json(partial / STATE, state)
    for old in checkpoints(out)[:-keep]:
        shutil.rmtree(old)
    return final


def read_state(path: Path) -> dict[str, Any]:
    return json.loads((path / STATE).read_text(encoding="utf-8"))


def load_checkpoint(path: Path, draft: Eagle3Draft, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    """Weights into `draft` and AdamW state into `optimizer`, on the device the draft is on now."""
    draft.load_state_dict(load_file(str(path / MODEL)))
    if optimizer is not None:
        tensors = load_file(str(path / OPTIMIZER))
        params = dict(draft.named_parameters())
        for key, value in tensors.items():
            name, field = key.split("::")
            # On the parameter's device: fused AdamW refuses state on another device than its parameter.
            param = params[name]
            optimizer.state[param][field] = (value.reshape(()) if field == "step" else value).to(param.device)
    return read_state(path)


def load_draft(path: Path) -> tuple[Eagle3Draft, dict[str, Any]]:
    """The draft saved at a checkpoint (no optimizer), and its state.json."""
    state = read_state(path)
    draft = Eagle3Draft(DraftConfig.from_json(state["draft_config"]))
    draft.load_state_dict(load_file(str(path / MODEL)))
    return draft, state
