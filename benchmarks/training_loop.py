"""Timing the trainer's own optimizer step (eagle3/training/objective.py: train_step) over given batches."""

import time

from eagle3.training.distributed import Dist
from eagle3.training.objective import Objective, train_step, training_precision


def timed_steps(objective: Objective, optimizer, batches, config) -> tuple[float, int]:
    """Run one optimizer step per batch in this process, on the CPU, in train.precision resolved for it;
    (seconds, padded tokens)."""
    alone = Dist()
    precision = training_precision(config, alone.device)
    tokens, started = 0, time.perf_counter()
    for batch in batches:
        train_step(objective, objective, optimizer, [batch], alone, config.grad_clip, precision)
        tokens += batch["input_ids"].numel()
    return time.perf_counter() - started, tokens
