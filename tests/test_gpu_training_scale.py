"""The gpu tier's training at the hero run's draft shape: what `eagle3 plan` and `eagle3 check` predict without a
GPU (eagle3/training/memory.py: the real step on fake tensors) against the real step on this GPU, with the shipped
Kimi-K2.5 configuration's train settings (its optimizer, TTT depth, draft vocabulary and activation checkpointing).

The draft and the verifier's embedding are built once, on the GPU (~6 GB at this shape), and stepped at each
length in turn; the peak of each length's second step is compared with the estimate, and its tokens/s printed for
the plan's rates. A length the estimate says does not fit this GPU must run out of memory here too."""

import time

import pytest
import torch
import yaml

from eagle3.init.shipped import CONFIGS_DIR, render
from eagle3.params.loading import validate
from eagle3.params.params_file import Params
from eagle3.plan.facts import KIMI_K2_5_TEXT_CONFIG
from eagle3.training.distributed import Dist
from eagle3.training.memory import Estimator, GiB, draft_config_for, make_objective_for, sample_batch
from eagle3.training.objective import train_step
from eagle3.training.optimizers import make_optimizer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (make gpu-check)"),
]
LENGTHS = (2048, 8192, 16384)
# The estimate counts every tensor's storage; the allocator rounds blocks up and keeps cuBLAS workspaces, so the
# measured peak may sit a little above it, never far below (a far lower peak means the estimate counts a tensor the
# step does not keep).
ABOVE, BELOW = 1.10, 0.85


def test_a_training_step_at_kimi_k2_5_s_draft_shape_is_what_the_plan_estimates():
    params = validate(yaml.safe_load(render("kimi-k2.5", "B")), Params, CONFIGS_DIR / "kimi-k2.5.yaml")
    train = params.train
    config = draft_config_for(KIMI_K2_5_TEXT_CONFIG, params.vocab.draft_vocab_size, train)
    recompute, device = train.activation_checkpointing, torch.device("cuda")
    estimator = Estimator(config, train.ttt_steps, "bfloat16", train.optimizer)
    free, _ = torch.cuda.mem_get_info(device)
    objective = make_objective_for(config, train.ttt_steps, recompute, "bfloat16", device)
    optimizer = make_optimizer(objective.draft, train)
    world = Dist(device=device)
    for tokens in LENGTHS:
        estimate = estimator.memory(tokens, recompute).total
        batch = {k: v.to(device) for k, v in sample_batch(config, 1, tokens, train.ttt_steps).items()}
        try:
            for step in range(2):
                if step == 1:
                    torch.cuda.synchronize(device)
                    torch.cuda.reset_peak_memory_stats(device)
                    started = time.monotonic()
                train_step(objective, objective, optimizer, [batch], world, 1.0, "bfloat16")
            torch.cuda.synchronize(device)
        except torch.OutOfMemoryError:
            print(f"{tokens:,} tokens: out of memory; estimate {estimate / GiB:.1f} GiB, {free / GiB:.1f} GiB free")
            assert estimate > 0.9 * free, (tokens, estimate / GiB, free / GiB)
            break
        seconds, peak = time.monotonic() - started, torch.cuda.max_memory_allocated(device)
        print(
            f"{tokens:,} tokens x {train.ttt_steps} TTT, {train.optimizer}, recompute {recompute}: peak "
            f"{peak / GiB:.1f} GiB (estimate {estimate / GiB:.1f}), {tokens / seconds:,.0f} tokens/s"
        )
        assert BELOW * estimate <= peak <= ABOVE * estimate, (tokens, peak / GiB, estimate / GiB)
        del batch
