"""Steps of a tiny draft as the train stage runs them, in one process or under torchrun (tests/test_sharding.py):
`python sharded_training.py SHARDING STEPS DIR [OPTIMIZER [LAYER]]` resumes from the newest checkpoint in DIR if
there is one, saves one after every step, and has rank 0 write DIR/result-<start>.json (the global loss of each step,
the rows of each parameter this process holds, whether AdamW is the fused one). OPTIMIZER: train.optimizer (adamw);
LAYER: train.draft_layer (llama)."""

import json
import sys
from pathlib import Path

import torch

from eagle3.formats.checkpoints import (
    CheckpointState,
    checkpoint_bytes,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from eagle3.params.train import TrainParams
from eagle3.training.distributed import distribute, setup_distributed
from eagle3.training.memory import draft_config_for, make_objective_for
from eagle3.training.objective import train_step
from eagle3.training.optimizers import make_optimizer

# Wide enough that summing a gradient's squares whole or in two slices rounds differently in fp32.
VERIFIER = {
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 12,
    "vocab_size": 2000,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "rope_theta": 10000.0,
}
SEQUENCES, TOKENS = 4, 64


def global_batch(step: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(100 + step)
    return {
        "input_ids": torch.randint(0, 2000, (SEQUENCES, TOKENS), generator=generator),
        "loss_mask": torch.rand(SEQUENCES, TOKENS, generator=generator) > 0.2,
        "aux": torch.randn(SEQUENCES, TOKENS, 768, generator=generator).bfloat16(),
        "final": torch.randn(SEQUENCES, TOKENS, 256, generator=generator).bfloat16(),
    }


def main() -> None:
    sharding, steps, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    optimizer_name = sys.argv[4] if len(sys.argv) > 4 else "adamw"
    train = TrainParams(
        learning_rate=3e-3, optimizer=optimizer_name, draft_layer=sys.argv[5] if len(sys.argv) > 5 else "llama"
    )
    world = setup_distributed()
    torch.manual_seed(0)  # the same initial draft on every process, as the train stage's init_draft makes it
    objective = make_objective_for(draft_config_for(VERIFIER, 500, train), 3, "off", "float32")
    draft = objective.draft
    model = distribute(objective, world, sharding)
    optimizer = make_optimizer(draft, train)
    world.open_writer_wait(checkpoint_bytes(draft, optimizer))
    checkpoint = latest_checkpoint(out)
    start = load_checkpoint(checkpoint, draft, optimizer).step if checkpoint else 0
    losses = []
    for step in range(start, steps):
        # Rank r takes every world-size-th sequence: how a batch is shared out does not matter to sharding.
        batch = {name: tensor[world.rank :: world.size] for name, tensor in global_batch(step).items()}
        result = train_step(model, objective, optimizer, [batch], world, 1.0, "float32")
        losses.append(float((world.all_sum(result.sums.clone()) / result.counts).sum()))
        state = CheckpointState(step=step + 1, total_steps=steps, run_key="test", draft_config=draft.config)
        save_checkpoint(out, draft, optimizer, state, keep=steps, write=world.main)
        world.wait_for_writer()
    if world.main:
        rows = {
            name: tuple(p.to_local().shape if hasattr(p, "to_local") else p.shape)
            for name, p in draft.named_parameters()
        }
        fused = optimizer.optimizers[-1].defaults["fused"]  # AdamW's
        result = {"losses": losses, "rows": rows, "fused": fused, "processes": world.size}
        (out / f"result-{start}.json").write_text(json.dumps(result))
    world.close()


if __name__ == "__main__":
    main()
