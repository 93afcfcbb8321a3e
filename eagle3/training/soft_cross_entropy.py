"""The draft's final norm, head and soft cross-entropy against the verifier's distribution, every TTT step in one
call, a bounded number of rows at a time.

Unfused, each TTT step keeps [positions, draft vocab] fp32 logits plus their softmax for the backward: at 16K
positions and a 32K draft vocab that is 4 GiB per step, 28 GiB over 7 steps. Here the gradient with respect to
the logits, softmax(z) * sum(p) - p, is formed chunk by chunk during the forward and immediately contracted into
the gradients of the head's input and weight (the same three matmuls autograd would run) and taken back through
the norm (eagle3/modeling/draft.py's rms_norm arithmetic), so only one chunk of logits and of fp32 norm
temporaries exists at a time, the features are not kept, and the backward only scales the stored gradients.

The loss is sum_i scale_i * sum_i with each step's scale known before the forward (its loss weight over the
positions that count), so the weights' gradients are accumulated over the steps into one fp32 buffer each rather
than one per step (0.9 GiB each for Kimi-K2.5's draft head), and the features' gradient is kept in their dtype.
"""

import torch

from eagle3.modeling.norms import norm_dtype, rms_norm, rms_norm_backward

# Logit elements per chunk (256 MiB in fp32): ~2K rows of a 32K draft vocab, enough to keep a GPU's matmuls busy.
CHUNK_ELEMENTS = 1 << 26


class SoftCrossEntropy(torch.autograd.Function):
    """sum over steps i of scales[i] * (sum over rows r of step i of -sum_v targets[rows[r], v] *
    log_softmax(rms_norm(features[r]) @ head^T)_v), each step's sum, and how many of its rows' argmax equals
    top1[rows[r]]. features [N, H] (the steps' rows one after the other, `sizes` of them per step), norm [H],
    head [V, H], targets [M, V] fp32, rows [N], top1 [M], scales [steps] fp32."""

    @staticmethod
    def forward(ctx, features, norm, eps, head, targets, rows, top1, sizes, scales):
        chunk = max(1, CHUNK_ELEMENTS // head.shape[0])
        dtype = norm_dtype(norm, features)
        grad_features = torch.empty_like(features)
        grad_norm = torch.zeros(norm.shape, dtype=torch.float32, device=norm.device)
        # A frozen head (train.freeze_lm_head) needs no gradient: one matmul per chunk less.
        head_grad = ctx.needs_input_grad[3]
        grad_head = torch.zeros(head.shape, dtype=torch.float32, device=head.device) if head_grad else None
        step_sums: list[torch.Tensor] = []
        step_corrects: list[torch.Tensor] = []
        start = 0
        for step, size in enumerate(sizes):
            step_sum = torch.zeros((), dtype=torch.float32, device=features.device)
            step_correct = torch.zeros((), dtype=torch.int64, device=features.device)
            for first in range(start, start + size, chunk):
                end = min(first + chunk, start + size)
                x, inverse = rms_norm(features[first:end], norm, eps, dtype)
                where = rows[first:end]
                logits = (x @ head.T).float()
                p = targets[where]
                mass = p.sum(-1)
                lse = logits.logsumexp(-1)
                step_sum += (lse * mass - (p * logits).sum(-1)).sum()
                step_correct += (logits.argmax(-1) == top1[where]).sum()
                grad_logits = (logits - lse[:, None]).exp_().mul_(mass[:, None]).sub_(p).to(x.dtype)
                if head_grad:
                    grad_head += (grad_logits.T @ x).float().mul_(scales[step])
                grad_x = grad_logits @ head.to(x.dtype)
                grad_features[first:end], grad_step_norm = rms_norm_backward(grad_x, features[first:end], norm, inverse)
                grad_norm += grad_step_norm.mul_(scales[step])
            step_sums.append(step_sum)
            step_corrects.append(step_correct)
            start += size
        sums, correct = torch.stack(step_sums), torch.stack(step_corrects)
        ctx.save_for_backward(grad_features, grad_norm, grad_head, scales)
        ctx.sizes, ctx.dtypes = sizes, (norm.dtype, head.dtype)
        ctx.mark_non_differentiable(sums, correct)
        return (sums * scales).sum(), sums, correct

    @staticmethod
    def backward(ctx, grad_loss, _grad_sums, _grad_correct):
        grad_features, grad_norm, grad_head, scales = ctx.saved_tensors
        scaled = torch.empty_like(grad_features)
        start = 0
        for step, size in enumerate(ctx.sizes):
            # In fp32, so the step's scale is not rounded to the dtype of the stored gradient.
            part = grad_features[start : start + size].float() * (grad_loss * scales[step])
            scaled[start : start + size] = part.to(grad_features.dtype)
            start += size
        norm_dtype_, head_dtype = ctx.dtypes
        return (
            scaled,
            (grad_norm * grad_loss).to(norm_dtype_),
            None,
            (grad_head * grad_loss).to(head_dtype) if grad_head is not None else None,
            None,
            None,
            None,
            None,
            None,
        )


def soft_cross_entropy(
    features: torch.Tensor,
    norm: torch.Tensor,
    eps: float,
    head: torch.Tensor,
    targets: torch.Tensor,
    rows: torch.Tensor,
    top1: torch.Tensor,
    sizes: list[int],
    scales: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the scaled loss, each step's sum, each step's top-1 agreements); see SoftCrossEntropy."""
    return SoftCrossEntropy.apply(features, norm, eps, head, targets, rows, top1, sizes, scales)
