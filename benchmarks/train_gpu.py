"""One training step at the hero run's shape: step time, tokens/s and peak memory of the linear-memory attention at
each train.activation_checkpointing setting (off, mlp, full), beside the quadratic reference it replaced
(eagle3/modeling/reference_attention.py) where that still fits. benchmarks/train_memory.py has the memory
without a GPU.

The draft is shaped as the train stage shapes it (DraftConfig.from_verifier) from a verifier config: a model
directory's config.json (`--verifier DIR`), or a built-in shape that needs no weights (`--shape kimi-k2.5`, the
default, or `--shape tiny` for a CPU smoke run). Weights, hidden states and token ids are random: the cost of a
step does not depend on their values. Each arm runs the real step (eagle3/training/objective.py: train_step,
fused AdamW, bf16 autocast) on batch 1, one warm-up step then the median of `--steps` timed ones; arms alternate
in one process and the ratios printed are each arm / off.

    python benchmarks/train_gpu.py --tokens 2048 8192 16384 --ttt-steps 7          # an H200
    python benchmarks/train_gpu.py --shape tiny --tokens 256 1024 --ttt-steps 3     # any CPU
"""

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from eagle3.formats.hf_config import text_config
from eagle3.modeling.attention import ttt_attention
from eagle3.modeling.draft import DraftConfig, Eagle3Draft
from eagle3.modeling.reference_attention import reference_ttt_attention
from eagle3.params.train import TrainParams
from eagle3.plan.facts import KIMI_K2_5_TEXT_CONFIG
from eagle3.training.distributed import Dist
from eagle3.training.objective import Objective, train_step, training_precision
from eagle3.training.optimizers import make_optimizer

# Kimi-K2.5's language model (eagle3/plan/facts.py), and a shape any CPU steps in seconds.
SHAPES = {
    "kimi-k2.5": KIMI_K2_5_TEXT_CONFIG,
    "tiny": {
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "num_hidden_layers": 12,
        "vocab_size": 2048,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "rope_theta": 10000.0,
    },
}
# Arm: (attention, train.activation_checkpointing).
ARMS = {
    "off": (ttt_attention, "off"),
    "mlp": (ttt_attention, "mlp"),
    "full": (ttt_attention, "full"),
    "reference": (reference_ttt_attention, "off"),
}


def verifier_config(args: argparse.Namespace) -> dict:
    if args.verifier is not None:
        return json.loads((args.verifier / "config.json").read_text(encoding="utf-8"))
    return SHAPES[args.shape]


def peak_memory(device: torch.device) -> int | None:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


def measure(arm: str, config: DraftConfig, tokens: int, ttt_steps: int, device: torch.device, repeats: int):
    """(median step seconds, peak bytes or None) of one arm, or None when it runs out of memory."""
    torch.manual_seed(0)
    draft = Eagle3Draft(config)
    draft.init_weights(torch.Generator().manual_seed(0))
    draft.midlayer.self_attn.attend, recompute = ARMS[arm]
    hidden, layers = config.hidden_size, len(config.aux_layer_ids)
    train = TrainParams(ttt_steps=ttt_steps, activation_checkpointing=recompute)
    objective = Objective(
        draft,
        embed=torch.randn(config.vocab_size, hidden, dtype=torch.bfloat16) * 0.02,
        draft_lm_head=(torch.randn(config.draft_vocab_size, hidden) * 0.02).to(torch.bfloat16),
        t2d=torch.ones(config.vocab_size, dtype=torch.bool),  # every position counts: the costliest case
        ttt_steps=ttt_steps,
        step_weight=train.step_weight,
        recompute=recompute,
    ).to(device)
    optimizer = make_optimizer(draft, train)
    generator = torch.Generator().manual_seed(1)
    batch = {
        "input_ids": torch.randint(0, config.vocab_size, (1, tokens), generator=generator),
        "loss_mask": torch.ones(1, tokens, dtype=torch.bool),
        "aux": torch.randn(1, tokens, layers * hidden, generator=generator).to(torch.bfloat16),
        "final": torch.randn(1, tokens, hidden, generator=generator).to(torch.bfloat16),
    }
    batch = {name: tensor.to(device) for name, tensor in batch.items()}
    world = Dist(device=device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    try:
        for _ in range(repeats + 1):
            started = time.perf_counter()
            result = train_step(
                objective, objective, optimizer, [batch], world, train.grad_clip, training_precision(train, device)
            )
            float(result.loss)  # waits for the device
            times.append(time.perf_counter() - started)
    except torch.OutOfMemoryError:
        return None
    finally:
        del objective, optimizer, draft
    return statistics.median(times[1:]), peak_memory(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verifier", type=Path, help="a verifier model directory (its config.json)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="kimi-k2.5")
    parser.add_argument("--tokens", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    parser.add_argument("--ttt-steps", type=int, nargs="+", default=[7])
    parser.add_argument("--draft-vocab", type=int, help="draft vocabulary (default: 32,000; 256 for the tiny shape)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per arm (median), after one warm-up")
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    verifier = verifier_config(args)
    draft_vocab = args.draft_vocab or (256 if args.shape == "tiny" and args.verifier is None else 32000)
    layers = text_config(verifier)["num_hidden_layers"]
    config = DraftConfig.from_verifier(verifier, (2, layers // 2, layers - 3), draft_vocab)
    print(
        f"draft: hidden {config.hidden_size}, {config.num_attention_heads} heads x {config.head_dim} "
        f"({config.num_key_value_heads} KV), MLP {config.intermediate_size}, draft vocab {draft_vocab}; "
        f"device {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, bf16, batch 1"
    )
    print(f"{'tokens':>7} {'TTT':>4} {'arm':>10} {'step s':>8} {'tokens/s':>9} {'peak GiB':>9}")
    for tokens in args.tokens:
        for ttt_steps in args.ttt_steps:
            measured = {arm: measure(arm, config, tokens, ttt_steps, device, args.steps) for arm in args.arms}
            for arm, result in measured.items():
                if result is None:
                    print(f"{tokens:>7} {ttt_steps:>4} {arm:>10} {'out of memory':>28}")
                    continue
                seconds, peak = result
                memory = f"{peak / 2**30:.1f}" if peak is not None else "n/a"
                print(f"{tokens:>7} {ttt_steps:>4} {arm:>10} {seconds:>8.3f} {tokens / seconds:>9.0f} {memory:>9}")
            base = measured.get("off")
            for arm, result in measured.items():
                if arm == "off" or base is None or result is None:
                    continue
                memory = f", memory x{result[1] / base[1]:.2f}" if base[1] else ""
                print(f"{'':>7} {'':>4} {'ratio':>10} {arm}/off: time x{result[0] / base[0]:.2f}{memory}")


if __name__ == "__main__":
    main()
