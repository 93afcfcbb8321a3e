"""Training-time-test attention in memory linear in the sequence length.

At TTT step i >= 1 the query at position t attends to step 0's keys at positions <= t (a causal block) and to
the keys steps 1..i made at position t itself (i "own-step" keys, one per step: vLLM's draft KV cache). A
softmax over that union is the softmax over two groups merged through their log-sum-exps:

    out = w_c * causal_out + sum_j w_j * v_j,   (w_c, w_1..w_i) = softmax(lse_causal, s_1..s_i)

so the causal block goes through a fused attention kernel that also returns its log-sum-exp, and the own-step
terms are i dot products per position. Nothing of size T x T exists, in the forward or the backward.

The kernels (PyTorch's flash attention on CPU and CUDA, its memory-efficient attention for fp32 on CUDA) do not
propagate a gradient into their log-sum-exp output, and the merge needs one. `CausalAttentionWithLse` folds it
into the kernel's own backward through one extra value channel: with v' = [v, 1] and dO' = [dO, g], the
kernel's dP' = dO V^T + g while its rowsum(dO' * O') is unchanged when O' = [O, 0], so it computes
dS = P * (dP - rowsum(dO * O) + g), the exact gradient of (O, lse) with respect to the scores.
"""

import torch
import torch.nn.functional as F

# The CUDA kernels want a head size that is a multiple of 8; the extra channel is padded up to it.
ALIGN = 8


def ttt_attention(q: torch.Tensor, cache: list[tuple[torch.Tensor, torch.Tensor]], scale: float) -> torch.Tensor:
    """q [B, H, T, D] (rope applied); cache: per step so far, this one last, its keys and values [B, Hkv, T, D]
    (not repeated to H heads: query head h reads key head h // (H / Hkv), as transformers' repeat_kv)."""
    k0, v0 = cache[0]
    if q.numel() == 0:
        # An empty share of a batch (token-budget batching, more processes than sequences): the kernels divide by
        # the length. Every key and value stays in the graph so each parameter gets its (zero) gradient, as DDP
        # requires of every process.
        return q + sum(k.sum() + v.sum() for k, v in cache)
    if len(cache) == 1:
        return F.scaled_dot_product_attention(q, k0, v0, is_causal=True, scale=scale, enable_gqa=True)
    causal, lse = CausalAttentionWithLse.apply(q, k0, v0, scale)
    batch, heads, tokens, dim = q.shape
    kv_heads = k0.shape[1]
    grouped = q.view(batch, kv_heads, heads // kv_heads, tokens, dim)
    own = [(grouped * k[:, :, None]).sum(-1, dtype=torch.float32) * scale for k, _ in cache[1:]]
    weights = torch.stack([lse.view(grouped.shape[:-1]), *own], dim=-1).softmax(-1)
    out = WeightedValues.apply(weights, causal.view(grouped.shape), *(v for _, v in cache[1:]))
    return out.view(batch, heads, tokens, dim)


class WeightedValues(torch.autograd.Function):
    """weights[..., 0] * causal + sum_j weights[..., j] * values[j-1], summed in fp32, in causal's dtype.
    weights [B, Hkv, G, T, 1+i] fp32, causal [B, Hkv, G, T, D], values [B, Hkv, T, D] (shared by the G query heads
    of their group). Autograd of that expression keeps an fp32 copy of every value and of causal for the backward,
    i+1 copies of the heads' size at step i, quadratic in the TTT steps; this keeps only its inputs, which the
    attention keeps anyway."""

    @staticmethod
    def forward(ctx, weights, causal, *values):
        out = weights[..., 0, None] * causal.float()
        for j, v in enumerate(values, start=1):
            out = out + weights[..., j, None] * v[:, :, None].float()
        ctx.save_for_backward(weights, causal, *values)
        return out.to(causal.dtype)

    @staticmethod
    def backward(ctx, grad):
        weights, causal, *values = ctx.saved_tensors
        grad = grad.float()
        grad_weights = [(grad * causal.float()).sum(-1)]
        grad_causal = (grad * weights[..., 0, None]).to(causal.dtype)
        grad_values = []
        for j, v in enumerate(values, start=1):
            grad_weights.append((grad * v[:, :, None].float()).sum(-1))
            grad_values.append((grad * weights[..., j, None]).sum(2).to(v.dtype))
        return torch.stack(grad_weights, dim=-1), grad_causal, *grad_values


def _repeat(tensor: torch.Tensor, groups: int) -> torch.Tensor:
    return tensor if groups == 1 else tensor.repeat_interleave(groups, dim=1)


def _unrepeat(grad: torch.Tensor, groups: int) -> torch.Tensor:
    if groups == 1:
        return grad
    batch, heads, tokens, dim = grad.shape
    return grad.view(batch, heads // groups, groups, tokens, dim).sum(2)


def _widen(tensor: torch.Tensor, channel: torch.Tensor | float, width: int) -> torch.Tensor:
    """tensor [..., D] -> [..., width]: `channel` in column D, zeros after. (No slicing: on fake CUDA tensors,
    which the CUDA branch's tests run on, Python indexing is unsupported and cat/narrow are not.)"""
    rows = tensor.shape[:-1]
    column = channel.unsqueeze(-1) if isinstance(channel, torch.Tensor) else tensor.new_full((*rows, 1), channel)
    return torch.cat([tensor, column, tensor.new_zeros(*rows, width - tensor.shape[-1] - 1)], dim=-1)


def _kernel_forward(q, k, v, scale):
    """(out, lse [B, H, T] fp32, the kernel's name, tensors and numbers its backward needs)."""
    aten = torch.ops.aten
    if q.device.type != "cuda":
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True, scale=scale)
        return out, lse, "cpu", (), ()
    if q.dtype in (torch.float16, torch.bfloat16):
        out, lse, cum_q, cum_k, max_q, max_k, rng_state, unused, _ = aten._scaled_dot_product_flash_attention(
            q, k, v, 0.0, True, False, scale=scale
        )
        return out, lse, "flash", (lse, cum_q, cum_k, rng_state, unused), (max_q, max_k)
    out, lse, seed, offset = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, True, scale=scale)
    # The memory-efficient kernel pads its log-sum-exp along T; its backward wants it as returned.
    return out, lse.narrow(-1, 0, q.shape[2]), "efficient", (lse, seed, offset), ()


def _kernel_backward(kind, grad_out, q, k, v, out, lse, tensors, numbers, scale):
    aten = torch.ops.aten
    if kind == "cpu":
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, q, k, v, out, lse, 0.0, True, scale=scale
        )
    if kind == "flash":
        full_lse, cum_q, cum_k, rng_state, unused = tensors
        max_q, max_k = numbers
        return aten._scaled_dot_product_flash_attention_backward(
            grad_out, q, k, v, out, full_lse, cum_q, cum_k, max_q, max_k, 0.0, True, rng_state, unused, scale=scale
        )
    full_lse, seed, offset = tensors
    grads = aten._scaled_dot_product_efficient_attention_backward(
        grad_out, q, k, v, None, out, full_lse, seed, offset, 0.0, [True, True, True, False], True, scale=scale
    )
    return grads[:3]


class CausalAttentionWithLse(torch.autograd.Function):
    """(softmax(q k^T * scale, causal) v, its log-sum-exp per query), both differentiable; k, v may have fewer
    heads than q (grouped-query attention)."""

    @staticmethod
    def forward(ctx, q, k, v, scale):
        groups = q.shape[1] // k.shape[1]
        out, lse, kind, tensors, numbers = _kernel_forward(q, _repeat(k, groups), _repeat(v, groups), scale)
        ctx.save_for_backward(q, k, v, out, lse, *tensors)
        ctx.kind, ctx.numbers, ctx.scale, ctx.groups = kind, numbers, scale, groups
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse, *tensors = ctx.saved_tensors
        groups, dim = ctx.groups, q.shape[-1]
        width = -(-(dim + 1) // ALIGN) * ALIGN
        if grad_out is None:
            grad_out = torch.zeros_like(out)
        if grad_lse is None:
            grad_lse = torch.zeros_like(lse)
        grad_q, grad_k, grad_v = _kernel_backward(
            ctx.kind,
            _widen(grad_out, grad_lse.to(grad_out.dtype), width),
            _widen(q, 0.0, width),
            _widen(_repeat(k, groups), 0.0, width),
            _widen(_repeat(v, groups), 1.0, width),
            _widen(out, 0.0, width),
            lse,
            tensors,
            ctx.numbers,
            ctx.scale,
        )
        grad_q, grad_k, grad_v = (grad.narrow(-1, 0, dim) for grad in (grad_q, grad_k, grad_v))
        return grad_q, _unrepeat(grad_k, groups), _unrepeat(grad_v, groups), None
