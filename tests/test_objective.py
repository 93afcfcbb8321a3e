"""The chunked soft cross-entropy and the objective built on it, against the plain autograd computation."""

import pytest
import torch
import torch.nn.functional as F
from memory import PeakBytes

from eagle3.training import soft_cross_entropy as module
from eagle3.training.soft_cross_entropy import soft_cross_entropy


def problem(rows: int, vocab: int, hidden: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, hidden, generator=generator) * 2).requires_grad_()
    weight = (torch.randn(vocab, hidden, generator=generator) * 0.5).requires_grad_()
    targets = torch.randn(rows * 2, vocab, generator=generator).mul(3).softmax(-1)
    top1 = targets.argmax(-1)
    picked = torch.randperm(rows * 2, generator=generator)[:rows]
    top1[picked[::2]] = (x @ weight.T).argmax(-1)[::2]  # half the rows agree with the draft
    return x, weight, targets, picked, top1


@pytest.mark.parametrize("chunk_rows", [1, 7, 64, 1000])
def test_equals_autograd_cross_entropy_for_any_chunking(monkeypatch, chunk_rows):
    x, weight, targets, picked, top1 = problem(rows=50, vocab=96, hidden=16)
    monkeypatch.setattr(module, "CHUNK_ELEMENTS", chunk_rows * 96)
    loss, correct = soft_cross_entropy(x, weight, targets, picked, top1)
    grads = torch.autograd.grad(loss * 0.37, (x, weight))

    logits = x @ weight.T
    expected = F.cross_entropy(logits, targets[picked], reduction="sum")
    expected_grads = torch.autograd.grad(expected * 0.37, (x, weight))
    torch.testing.assert_close(loss, expected, atol=1e-4, rtol=1e-5)
    assert int(correct) == int((logits.argmax(-1) == top1[picked]).sum())
    assert 0 < int(correct) < 50
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_bf16_autocast_matches_autograd_under_autocast():
    x, weight, targets, picked, top1 = problem(rows=40, vocab=64, hidden=32, seed=3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = soft_cross_entropy(x, weight, targets, picked, top1)
        expected = F.cross_entropy((x @ weight.T).float(), targets[picked], reduction="sum")
    grads = torch.autograd.grad(loss, (x, weight))
    expected_grads = torch.autograd.grad(expected, (x, weight))
    assert grads[1].dtype == torch.float32
    torch.testing.assert_close(loss, expected, atol=1e-3, rtol=1e-3)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


def test_memory_holds_one_chunk_of_logits_not_all(monkeypatch):
    rows, vocab = 4096, 512
    x, weight, targets, picked, top1 = problem(rows=rows, vocab=vocab, hidden=8, seed=1)
    monkeypatch.setattr(module, "CHUNK_ELEMENTS", 256 * vocab)
    with PeakBytes() as chunked:
        loss, _ = soft_cross_entropy(x, weight, targets, picked, top1)
        loss.backward()
    with PeakBytes() as plain:
        F.cross_entropy(x @ weight.T, targets[picked], reduction="sum").backward()
    all_logits = rows * vocab * 4
    assert plain.peak > 2 * all_logits  # the logits and their softmax, kept for the backward
    assert chunked.peak < all_logits / 2, (chunked.peak, all_logits)


def test_activation_checkpointing_gives_the_same_gradients_from_less_kept_memory():
    from test_draft import tiny_draft

    from eagle3.training.objective import Objective

    generator = torch.Generator().manual_seed(4)
    tokens = 300
    batch = {
        "input_ids": torch.randint(0, 100, (2, tokens), generator=generator),
        "loss_mask": torch.rand(2, tokens, generator=generator) > 0.3,
        "aux": torch.randn(2, tokens, 96, generator=generator) * 4,
        "final": torch.randn(2, tokens, 32, generator=generator),
    }
    results = {}
    for recompute in (False, True):
        draft = tiny_draft()
        objective = Objective(
            draft,
            embed=torch.randn(100, 32, generator=torch.Generator().manual_seed(0)),
            draft_lm_head=torch.randn(40, 32, generator=torch.Generator().manual_seed(1)),
            t2d=torch.ones(100, dtype=torch.bool),
            steps=4,
            step_weight=0.8,
            recompute=recompute,
        )
        probs, top1, masks = objective.targets(batch)
        counts = torch.stack([m.sum() for m in masks]).float()
        with PeakBytes() as meter:
            loss, _, _ = objective(batch, probs, top1, masks, counts, 1)
            kept = meter.live
            loss.backward()
        results[recompute] = (loss.detach(), {n: p.grad for n, p in draft.named_parameters()}, kept)
    (plain_loss, plain_grads, plain_kept), (loss, grads, kept) = results[False], results[True]
    assert torch.equal(loss, plain_loss)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, plain_grads[name], atol=1e-6, rtol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
    assert kept < 0.5 * plain_kept, (kept, plain_kept)
