"""The single-process training step shared by the training benchmarks (eagle3/train.py's step without DDP,
logging or checkpoints)."""

import time

import torch


def timed_steps(objective, optimizer, batches, config) -> tuple[float, int]:
    """Run one optimizer step per batch; (seconds, padded tokens)."""
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.precision == "bf16")
    tokens, started = 0, time.perf_counter()
    for batch in batches:
        probs, top1, masks = objective.targets(batch)
        counts = torch.stack([m.sum() for m in masks]).float()
        with autocast:
            loss, _, _ = objective(batch, probs, top1, masks, counts, 1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(objective.draft.parameters(), config.grad_clip)
        optimizer.step()
        tokens += batch["input_ids"].numel()
    return time.perf_counter() - started, tokens
