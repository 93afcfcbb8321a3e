"""The fused norm + head + soft cross-entropy, the norms and the objective built on them, against the plain autograd
computation they replaced, and what each keeps for the backward."""

import pytest
import torch
import torch.nn.functional as F

from eagle3.modeling.norms import RMSNorm
from eagle3.modeling.reference_attention import reference_ttt_attention
from eagle3.training import soft_cross_entropy as module
from eagle3.training.memory import PeakBytes
from eagle3.training.objective import Objective
from eagle3.training.soft_cross_entropy import soft_cross_entropy

SIZES = [23, 17, 10]  # rows of three TTT steps
SCALES = torch.tensor([0.5, 0.3, 0.125, 0.0625])


def plain_norm(norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """The draft's RMSNorm as the plain expression autograd differentiates (what the trainer ran before)."""
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps)
    return norm.weight * x.to(dtype)


def problem(rows: int, vocab: int, hidden: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, hidden, generator=generator) * 2).requires_grad_()
    norm = RMSNorm(hidden, 1e-5)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(hidden, generator=generator))
    weight = (torch.randn(vocab, hidden, generator=generator) * 0.5).requires_grad_()
    targets = torch.randn(rows * 2, vocab, generator=generator).mul(3).softmax(-1)
    top1 = targets.argmax(-1)
    picked = torch.randperm(rows * 2, generator=generator)[:rows]
    with torch.no_grad():
        top1[picked[::2]] = (plain_norm(norm, x) @ weight.T).argmax(-1)[::2]  # half the rows agree with the draft
    return x, norm, weight, targets, picked, top1


def fused(x, norm, weight, targets, picked, top1, sizes=SIZES):
    return soft_cross_entropy(x, norm.weight, norm.eps, weight, targets, picked, top1, sizes, SCALES[: len(sizes)])


def expected_loss(x, norm, weight, targets, picked, sizes=SIZES):
    """sum_i scale_i * soft cross-entropy of step i, each step through F.cross_entropy."""
    logits = (plain_norm(norm, x) @ weight.T).float()
    start, losses = 0, []
    for size in sizes:
        rows = slice(start, start + size)
        losses.append(F.cross_entropy(logits[rows], targets[picked[rows]], reduction="sum"))
        start += size
    return torch.stack(losses), logits


@pytest.mark.parametrize("chunk_rows", [1, 7, 64, 1000])
def test_equals_autograd_cross_entropy_for_any_chunking(monkeypatch, chunk_rows):
    x, norm, weight, targets, picked, top1 = problem(rows=sum(SIZES), vocab=96, hidden=16)
    monkeypatch.setattr(module, "CHUNK_ELEMENTS", chunk_rows * 96)
    loss, sums, correct = fused(x, norm, weight, targets, picked, top1)
    inputs = (x, norm.weight, weight)
    grads = torch.autograd.grad(loss * 0.37, inputs)

    losses, logits = expected_loss(x, norm, weight, targets, picked)
    expected = (losses * SCALES[:3]).sum()
    expected_grads = torch.autograd.grad(expected * 0.37, inputs)
    torch.testing.assert_close(loss, expected, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(sums, losses.detach(), atol=1e-4, rtol=1e-5)
    agree = (logits.argmax(-1) == top1[picked]).split(SIZES)
    assert correct.tolist() == [int(a.sum()) for a in agree]
    assert 0 < int(correct.sum()) < sum(SIZES)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_bf16_autocast_matches_autograd_under_autocast():
    x, norm, weight, targets, picked, top1 = problem(rows=sum(SIZES), vocab=64, hidden=32, seed=3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _, _ = fused(x.bfloat16(), norm, weight, targets, picked, top1)
        losses, _ = expected_loss(x.bfloat16(), norm, weight, targets, picked)
    inputs = (x, norm.weight, weight)
    grads = torch.autograd.grad(loss, inputs)
    expected_grads = torch.autograd.grad((losses * SCALES[:3]).sum(), inputs)
    assert grads[2].dtype == torch.float32
    torch.testing.assert_close(loss, (losses * SCALES[:3]).sum(), atol=1e-3, rtol=1e-3)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


def test_memory_holds_one_chunk_of_logits_and_one_head_gradient_for_all_steps(monkeypatch):
    rows, vocab, hidden = 2048, 1024, 16
    x, norm, weight, targets, picked, top1 = problem(rows=rows, vocab=vocab, hidden=hidden, seed=1)
    monkeypatch.setattr(module, "CHUNK_ELEMENTS", 128 * vocab)
    steps = [rows // 4] * 4
    with PeakBytes([x, norm.weight, weight, targets, picked, top1]) as chunked:
        loss, _, _ = fused(x, norm, weight, targets, picked, top1, sizes=steps)
        kept = chunked.live
        loss.backward()
    with PeakBytes([x, norm.weight, weight, targets, picked, top1]) as plain:
        F.cross_entropy(plain_norm(norm, x) @ weight.T, targets[picked], reduction="sum").backward()
    all_logits, head = rows * vocab * 4, vocab * hidden * 4
    assert plain.peak > 2 * all_logits  # the logits and their softmax, kept for the backward
    assert chunked.peak < all_logits / 2, (chunked.peak, all_logits)
    # After the forward: the features' gradient and ONE fp32 gradient of the head for the four steps.
    assert kept < rows * hidden * 4 + 1.5 * head, (kept, head)


def test_norm_keeps_only_its_input_and_matches_the_plain_expression():
    generator = torch.Generator().manual_seed(7)
    norm = RMSNorm(64, 1e-5)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(64, generator=generator))
    x = torch.randn(300, 64, generator=generator).requires_grad_()
    upstream = torch.randn(300, 64, generator=generator)
    out = norm(x)
    grads = torch.autograd.grad(out, (x, norm.weight), upstream)
    plain = plain_norm(norm, x)
    assert torch.equal(out, plain)  # fp32: the same operations in the same order
    for got, want in zip(grads, torch.autograd.grad(plain, (x, norm.weight), upstream), strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)

    low = x.detach().bfloat16().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with PeakBytes([low, norm.weight]) as meter:
            out = norm(low)
            kept = meter.live - out.untyped_storage().nbytes()
        plain = plain_norm(norm, low)
    # bf16 out, with the values the plain fp32 output has once the next matmul rounds it.
    assert out.dtype == torch.bfloat16 and plain.dtype == torch.float32 and torch.equal(out, plain.bfloat16())
    assert kept <= 300 * 4, kept  # the per-row inverse norm; the plain expression keeps fp32 copies of x
    upstream = upstream.bfloat16()
    grads = torch.autograd.grad(out, (low, norm.weight), upstream)
    expected = torch.autograd.grad(plain, (low, norm.weight), upstream.float())
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got.float(), want.float(), atol=3e-2, rtol=2e-2)


def _batch(tokens: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    return {
        "input_ids": torch.randint(0, 100, (2, tokens), generator=generator),
        "loss_mask": torch.rand(2, tokens, generator=generator) > 0.3,
        "aux": torch.randn(2, tokens, 96, generator=generator) * 4,
        "final": torch.randn(2, tokens, 32, generator=generator),
    }


def _objective(draft, recompute: str = "off") -> Objective:
    t2d = torch.ones(100, dtype=torch.bool)
    t2d[::7] = False  # tokens the draft vocab cannot express do not count
    return Objective(
        draft,
        embed=torch.randn(100, 32, generator=torch.Generator().manual_seed(0)),
        draft_lm_head=torch.randn(40, 32, generator=torch.Generator().manual_seed(1)),
        t2d=t2d,
        ttt_steps=4,
        step_weight=0.8,
        recompute=recompute,
    )


def plain_objective_loss(objective: Objective, batch, probs, masks, counts) -> torch.Tensor:
    """The objective as the trainer computed it before: the quadratic reference attention, plain norms, one
    F.cross_entropy per TTT step."""
    draft = objective.draft
    features = draft.unroll(batch["input_ids"], batch["aux"], objective.embed, objective.ttt_steps)
    flat = probs.view(-1, probs.shape[-1])
    loss = torch.zeros(())
    for i, (step_features, mask) in enumerate(zip(features, masks, strict=True)):
        sequence, position = mask.nonzero(as_tuple=True)
        logits = draft.lm_head(plain_norm(draft.norm, step_features[sequence, position])).float()
        targets = flat[sequence * probs.shape[1] + position + i + 1]
        loss = loss + objective.weights[i] * F.cross_entropy(logits, targets, reduction="sum") / counts[i]
    return loss


@pytest.mark.parametrize(("precision", "tolerance"), [("float32", 1e-5), ("bfloat16", 2e-2)])
def test_objective_equals_the_plain_computation_it_replaced(monkeypatch, precision, tolerance):
    from test_draft import tiny_draft

    batch = _batch(90, torch.Generator().manual_seed(4))
    results = []
    for plain in (False, True):
        draft = tiny_draft()
        objective = _objective(draft)
        (probs, top1), masks = objective.distribution(batch), objective.counted(batch)
        counts = torch.stack([m.sum() for m in masks]).float()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bfloat16"):
            if plain:
                draft.midlayer.self_attn.attend = reference_ttt_attention
                monkeypatch.setattr(RMSNorm, "forward", plain_norm)
                loss = plain_objective_loss(objective, batch, probs, masks, counts)
            else:
                loss = objective(batch, probs, top1, masks, counts, 1)[0]
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in draft.named_parameters()}))
    (loss, grads), (expected, expected_grads) = results
    torch.testing.assert_close(loss, expected, atol=tolerance, rtol=tolerance)
    for name, grad in grads.items():
        want = expected_grads[name]
        scale = want.abs().max()
        assert scale > 0, name
        relative = grad / scale, want / scale
        torch.testing.assert_close(*relative, atol=tolerance, rtol=0, msg=lambda m, n=name: f"{n}: {m}")


def test_activation_checkpointing_gives_the_same_gradients_from_less_kept_memory():
    from test_draft import tiny_draft

    batch = _batch(300, torch.Generator().manual_seed(4))
    results = {}
    for recompute in ("off", "mlp", "full"):
        draft = tiny_draft()
        objective = _objective(draft, recompute)
        (probs, top1), masks = objective.distribution(batch), objective.counted(batch)
        counts = torch.stack([m.sum() for m in masks]).float()
        existing = [*objective.parameters(), *objective.buffers(), *batch.values(), probs, top1, *masks, counts]
        with PeakBytes(existing) as meter:
            loss, _, _ = objective(batch, probs, top1, masks, counts, 1)
            kept = meter.live
            loss.backward()
        results[recompute] = (loss.detach(), {n: p.grad for n, p in draft.named_parameters()}, kept)
    plain_loss, plain_grads, plain_kept = results["off"]
    for recompute in ("mlp", "full"):
        loss, grads, _ = results[recompute]
        assert torch.equal(loss, plain_loss), recompute
        for name, grad in grads.items():
            torch.testing.assert_close(
                grad, plain_grads[name], atol=1e-6, rtol=1e-6, msg=lambda m, n=name, r=recompute: f"{r} {n}: {m}"
            )
    mlp_kept, full_kept = results["mlp"][2], results["full"][2]
    assert full_kept < 0.5 * plain_kept and full_kept < mlp_kept < 0.85 * plain_kept, (plain_kept, mlp_kept, full_kept)


@pytest.mark.parametrize("max_norm", [0.5, 1e3])
def test_gradient_clipping_is_torchs_with_the_norm_summed_in_fp64(max_norm):
    from eagle3.training.objective import clip_gradients

    generator = torch.Generator().manual_seed(9)
    grads = [torch.randn(shape, generator=generator) * 0.01 for shape in [(300, 70), (70,), (5, 3, 2)]]
    ours, theirs = ([torch.zeros(g.shape, requires_grad=True) for g in grads] for _ in range(2))
    for mine, other, grad in zip(ours, theirs, grads, strict=True):
        mine.grad, other.grad = grad.clone(), grad.clone()
    norm = clip_gradients(ours, max_norm)
    expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm)
    assert norm == torch.cat([g.double().flatten() for g in grads]).norm().float()  # the fp64 norm, rounded once
    torch.testing.assert_close(norm, expected, atol=0, rtol=1e-6)
    assert (norm > max_norm) == (max_norm == 0.5)  # one case clips, the other leaves the gradients alone
    for mine, other in zip(ours, theirs, strict=True):
        torch.testing.assert_close(mine.grad, other.grad, atol=0, rtol=1e-6)


def test_a_frozen_head_gets_no_gradient_and_the_rest_the_same_gradients():
    """train.freeze_lm_head: the fused loss skips the head's gradient; every other gradient is what a trained head's
    step computes, so freezing changes nothing but the head."""
    x, norm, weight, targets, picked, top1 = problem(rows=sum(SIZES), vocab=96, hidden=16)
    loss, _, _ = fused(x, norm, weight, targets, picked, top1)
    trained = torch.autograd.grad(loss, (x, norm.weight, weight))
    frozen = weight.detach()
    loss, _, _ = fused(x, norm, frozen, targets, picked, top1)
    grad_x, grad_norm = torch.autograd.grad(loss, (x, norm.weight))
    assert torch.equal(grad_x, trained[0]) and torch.equal(grad_norm, trained[1])


def test_freeze_lm_head_and_adam_beta2_reach_the_optimizer():
    from test_draft import VERIFIER

    from eagle3.modeling.draft import DraftConfig
    from eagle3.params.train import TrainParams
    from eagle3.training.objective import init_draft
    from eagle3.training.optimizers import make_optimizer

    config = DraftConfig.from_verifier(VERIFIER, (2, 6, 9), draft_vocab_size=40)
    verifier = {"lm_head": torch.randn(100, 32)}
    d2t = torch.zeros(40, dtype=torch.int64)
    draft = init_draft(config, verifier, d2t, 0, freeze_lm_head=True)
    optimizer = make_optimizer(draft, TrainParams(adam_beta2=0.999))
    (group,) = optimizer.param_groups
    assert group["betas"] == (0.9, 0.999)
    assert not any(p is draft.lm_head.weight for p in group["params"])
    assert len(group["params"]) == len(list(draft.parameters())) - 1
    assert torch.equal(draft.lm_head.weight, verifier["lm_head"][:40])  # the verifier's rows, kept
    trained = init_draft(config, verifier, d2t, 0)
    assert make_optimizer(trained, TrainParams()).param_groups[0]["betas"] == (0.9, 0.95)
    assert any(p is trained.lm_head.weight for p in make_optimizer(trained, TrainParams()).param_groups[0]["params"])
