"""The draft's soft cross-entropy against the verifier's distribution, a bounded number of rows at a time.

Unfused, each TTT step keeps [positions, draft vocab] fp32 logits plus their softmax for the backward: at 16K
positions and a 32K draft vocab that is 4 GiB per step, 28 GiB over 7 steps. Here the gradient with respect to
the logits, softmax(z) * sum(p) - p, is formed chunk by chunk during the forward and immediately contracted into
the gradients of the head's input and weight (the same three matmuls autograd would run), so only one chunk of
logits exists at a time and the backward only scales the stored gradients by the incoming one.
"""

import torch

# Logit elements per chunk (256 MiB in fp32): ~2K rows of a 32K draft vocab, enough to keep a GPU's matmuls busy.
CHUNK_ELEMENTS = 1 << 26


class SoftCrossEntropy(torch.autograd.Function):
    """sum over rows r of -sum_v targets[rows[r], v] * log_softmax(hidden[r] @ weight^T)_v, and how many rows'
    argmax equals top1[rows[r]]. hidden [N, H], weight [V, H], targets [M, V] fp32, rows [N], top1 [M]."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, rows, top1):
        chunk = max(1, CHUNK_ELEMENTS // weight.shape[0])
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        correct = torch.zeros((), dtype=torch.int64, device=hidden.device)
        for first in range(0, hidden.shape[0], chunk):
            x = hidden[first : first + chunk]
            where = rows[first : first + chunk]
            logits = (x @ weight.T).float()
            p = targets[where]
            mass = p.sum(-1)
            lse = logits.logsumexp(-1)
            loss += (lse * mass - (p * logits).sum(-1)).sum()
            correct += (logits.argmax(-1) == top1[where]).sum()
            grad_logits = (logits - lse[:, None]).exp_().mul_(mass[:, None]).sub_(p).to(x.dtype)
            grad_hidden[first : first + chunk] = grad_logits @ weight.to(x.dtype)
            grad_weight += (grad_logits.T @ x).float()
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        ctx.mark_non_differentiable(correct)
        return loss, correct

    @staticmethod
    def backward(ctx, grad_loss, _grad_correct):
        grad_hidden, grad_weight = ctx.saved_tensors
        scaled_weight = (grad_weight * grad_loss).to(ctx.weight_dtype)
        return grad_hidden * grad_loss.to(grad_hidden.dtype), scaled_weight, None, None, None


def soft_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, rows: torch.Tensor, top1: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return SoftCrossEntropy.apply(hidden, weight, targets, rows, top1)
