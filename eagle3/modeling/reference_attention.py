"""The training-time-test attention as first written: the full [B, H, T, T] score matrix per step.

Quadratic in T (out of memory at 6K tokens x 7 steps for Kimi-K2.5's draft shape on an H200), so training uses
eagle3/modeling/attention.py; this stays as the oracle the tests hold that implementation to, and as the baseline
benchmarks/train_gpu.py measures it against. Same arguments as `attention.ttt_attention`.
"""

import torch
import torch.nn.functional as F


def reference_ttt_attention(
    q: torch.Tensor, cache: list[tuple[torch.Tensor, torch.Tensor]], scale: float
) -> torch.Tensor:
    groups = q.shape[1] // cache[0][0].shape[1]
    keys = [k.repeat_interleave(groups, dim=1) for k, _ in cache]
    values = [v.repeat_interleave(groups, dim=1) for _, v in cache]
    if len(cache) == 1:
        return F.scaled_dot_product_attention(q, keys[0], values[0], is_causal=True, scale=scale)
    tokens = q.shape[2]
    causal = torch.matmul(q, keys[0].transpose(-1, -2)).float() * scale
    future = torch.ones(tokens, tokens, dtype=torch.bool, device=q.device).triu(1)
    causal = causal.masked_fill(future, float("-inf"))
    own = [(q * k).sum(-1).float() * scale for k in keys[1:]]
    weights = torch.cat([causal, torch.stack(own, dim=-1)], dim=-1).softmax(-1).to(q.dtype)
    out = torch.matmul(weights[..., :tokens], values[0])
    for j, v in enumerate(values[1:]):
        out = out + weights[..., tokens + j, None] * v
    return out
