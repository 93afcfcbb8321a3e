"""The linear-memory training-time-test attention against the quadratic reference it replaced."""

import math

import pytest
import torch

from eagle3.modeling.attention import CausalAttentionWithLse, ttt_attention
from eagle3.modeling.reference_attention import reference_ttt_attention
from eagle3.training.memory import PeakBytes


def cache_of(steps: int, batch: int, kv_heads: int, tokens: int, dim: int, generator: torch.Generator):
    return [
        (
            torch.randn(batch, kv_heads, tokens, dim, generator=generator).requires_grad_(),
            torch.randn(batch, kv_heads, tokens, dim, generator=generator).requires_grad_(),
        )
        for _ in range(steps)
    ]


def attention_and_grads(attend, q, cache, upstream):
    out = attend(q, cache, 1.0 / math.sqrt(q.shape[-1]))
    inputs = [q, *(t for pair in cache for t in pair)]
    return out, torch.autograd.grad(out, inputs, upstream)


@pytest.mark.parametrize(
    ("tokens", "steps", "heads", "kv_heads", "dim"),
    [(1, 2, 2, 2, 8), (7, 2, 4, 4, 8), (33, 3, 4, 2, 16), (64, 7, 6, 2, 12), (130, 4, 8, 1, 32), (257, 5, 3, 3, 20)],
)
def test_equals_the_quadratic_reference_forward_and_backward(tokens, steps, heads, kv_heads, dim):
    generator = torch.Generator().manual_seed(tokens * 31 + steps)
    q = (torch.randn(2, heads, tokens, dim, generator=generator) * 2).requires_grad_()
    cache = cache_of(steps, 2, kv_heads, tokens, dim, generator)
    upstream = torch.randn(2, heads, tokens, dim, generator=generator)
    expected, expected_grads = attention_and_grads(reference_ttt_attention, q, cache, upstream)
    actual, grads = attention_and_grads(ttt_attention, q, cache, upstream)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    names = ["q"] + [f"{kind}{j}" for j in range(steps) for kind in "kv"]
    for name, got, want in zip(names, grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=lambda m, name=name: f"d{name}: {m}")
    # The own-step terms matter: dropping the last step's key changes the output.
    assert (ttt_attention(q, cache[:-1], 1.0 / math.sqrt(dim)) - actual).abs().max() > 1e-2


def test_the_log_sum_exp_and_its_gradient_are_exact():
    generator = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 4, 19, 8, generator=generator, dtype=torch.float64) for _ in range(3))
    inputs = [t.float().requires_grad_() for t in (q, k, v)]
    out, lse = CausalAttentionWithLse.apply(*inputs, 0.3)
    scores = (q @ k.transpose(-1, -2) * 0.3).masked_fill(torch.ones(19, 19, dtype=torch.bool).triu(1), -math.inf)
    torch.testing.assert_close(lse.double(), scores.logsumexp(-1), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.double(), scores.softmax(-1) @ v, atol=1e-5, rtol=0)
    # d(sum lse)/dq_t = scale * sum_s P_ts k_s: a kernel that drops the lse gradient gets zero here.
    (grad_q,) = torch.autograd.grad(lse.sum(), inputs[0])
    torch.testing.assert_close(grad_q.double(), 0.3 * scores.softmax(-1) @ k, atol=1e-5, rtol=0)


def test_bf16_stays_close_to_fp32():
    generator = torch.Generator().manual_seed(2)
    q = torch.randn(1, 4, 50, 16, generator=generator)
    cache = [(k.detach(), v.detach()) for k, v in cache_of(3, 1, 2, 50, 16, generator)]
    exact = ttt_attention(q, cache, 0.25)
    low = ttt_attention(q.bfloat16(), [(k.bfloat16(), v.bfloat16()) for k, v in cache], 0.25)
    assert low.dtype == torch.bfloat16
    assert (low.float() - exact).abs().max() < 0.05


def step_peak_bytes(attend, tokens: int) -> int:
    """Peak memory of one TTT step (the 4th) of attention, forward and backward."""
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(1, 8, tokens, 16, generator=generator).requires_grad_()
    cache = cache_of(4, 1, 4, tokens, 16, generator)
    with PeakBytes() as meter:
        out = attend(q, cache, 0.25)
        out.backward(torch.ones_like(out))
    return meter.peak


def test_peak_memory_of_a_step_grows_linearly_in_the_sequence_length():
    short, long = step_peak_bytes(ttt_attention, 512), step_peak_bytes(ttt_attention, 2048)
    assert 3.5 < long / short < 4.5, (short, long)
    # Per token and head it holds a few head-size vectors, nothing that grows with T.
    assert long / (2048 * 8 * 16 * 4) < 40
    # The meter sees the quadratic reference for what it is (so the bound above can fail).
    reference_short, reference_long = (
        step_peak_bytes(reference_ttt_attention, 512),
        step_peak_bytes(reference_ttt_attention, 2048),
    )
    assert reference_long / reference_short > 12
    assert reference_long > 20 * long


def test_a_late_step_keeps_no_fp32_copy_of_any_value():
    # Step 7 merges the causal block with six own-step values. Autograd of the plain merge kept an fp32 copy of
    # each of them and of the causal output for the backward: 10x the bf16 queries' bytes here.
    generator = torch.Generator().manual_seed(3)
    q = torch.randn(1, 8, 256, 16, generator=generator).bfloat16().requires_grad_()
    cache = [(k.bfloat16(), v.bfloat16()) for k, v in cache_of(7, 1, 4, 256, 16, generator)]
    with PeakBytes([q, *(t for pair in cache for t in pair)]) as meter:
        out = ttt_attention(q, cache, 0.25)
        kept = meter.live - out.untyped_storage().nbytes()
    # The causal output (q's size), its log-sum-exp and the merge weights (7 fp32 per query and head).
    assert kept < 3 * q.nbytes, (kept, q.nbytes)
