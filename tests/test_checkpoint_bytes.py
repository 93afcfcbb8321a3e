"""checkpoint_bytes: what a checkpoint's tensors take, from the draft and its optimizer's state fields, before the
first step as after it, against the bytes of a real checkpoint's tensors (eagle3/formats/checkpoints.py)."""

import pytest
import torch
from safetensors import safe_open
from test_memory import SMALL

from eagle3.formats.checkpoints import MODEL, OPTIMIZER, CheckpointState, checkpoint_bytes, save_checkpoint
from eagle3.params.train import TrainParams
from eagle3.training.distributed import Dist
from eagle3.training.memory import draft_config_for, make_objective_for, sample_batch
from eagle3.training.objective import train_step
from eagle3.training.optimizers import make_optimizer


def _tensor_bytes(path) -> int:
    with safe_open(path, "pt") as tensors:
        return sum(tensors.get_tensor(name).nbytes for name in tensors.keys())


@pytest.mark.parametrize("optimizer_name", ["adamw", "muon"])
@pytest.mark.parametrize("layer", ["llama", "mla"])
def test_checkpoint_bytes_are_the_written_checkpoint_s(tmp_path, optimizer_name, layer):
    train = TrainParams(optimizer=optimizer_name, draft_layer=layer)
    config = draft_config_for(SMALL, 300, train)
    torch.manual_seed(0)
    objective = make_objective_for(config, 2, "off", "float32")
    optimizer = make_optimizer(objective.draft, train)
    before = checkpoint_bytes(objective.draft, optimizer)
    train_step(objective, objective, optimizer, [sample_batch(config, 1, 64, 2)], Dist(), 1.0, "float32")
    assert checkpoint_bytes(objective.draft, optimizer) == before
    state = CheckpointState(step=1, total_steps=1, run_key="bytes", draft_config=config)
    saved = save_checkpoint(tmp_path, objective.draft, optimizer, state, keep=1)
    assert _tensor_bytes(saved / MODEL) + _tensor_bytes(saved / OPTIMIZER) == before
