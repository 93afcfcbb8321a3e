"""RMSNorm as the draft computes it, with a backward that keeps only its input (the MLA attention's low-rank
norms and the draft layer's own use it; training's fused output loss reuses its arithmetic)."""

import torch
from torch import nn


def norm_dtype(weight: torch.Tensor, x: torch.Tensor) -> torch.dtype:
    """What RMSNorm returns: under autocast, x's dtype (every consumer is a matmul that rounds to it anyway: the
    same values in half the bytes); outside autocast, the dtype weight * x has."""
    return x.dtype if torch.is_autocast_enabled(x.device.type) else torch.promote_types(weight.dtype, x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, dtype: torch.dtype):
    """(weight * x / rms(x) in `dtype`, the per-row 1 / rms in fp32), in fp32 as transformers' LlamaRMSNorm."""
    inverse = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    return (weight * (x.float() * inverse).to(x.dtype)).to(dtype), inverse


def rms_norm_backward(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, inverse: torch.Tensor):
    """(gradient with respect to x in x's dtype, with respect to weight in fp32) of rms_norm, recomputed from x."""
    wide, grad = x.float(), grad.float()
    grad_weight = (grad * (wide * inverse).to(x.dtype)).reshape(-1, weight.shape[0]).sum(0)
    # The gradient reaching the normalised x is rounded to x's dtype, as autograd of rms_norm rounds it.
    grad_normed = (grad * weight).to(x.dtype).float()
    along = (grad_normed * wide).sum(-1, keepdim=True) * inverse.pow(3) / x.shape[-1]
    return (grad_normed * inverse - wide * along).to(x.dtype), grad_weight


class _RMSNormFunction(torch.autograd.Function):
    """rms_norm keeping only x (in its own dtype) and the per-row inverse norm for the backward: autograd of the
    expression keeps an fp32 copy of x, and its fp32 output makes each bf16 matmul after it keep a copy of its
    own."""

    @staticmethod
    def forward(ctx, x, weight, eps, dtype):
        out, inverse = rms_norm(x, weight, eps, dtype)
        ctx.save_for_backward(x, weight, inverse)
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight, inverse = ctx.saved_tensors
        grad_x, grad_weight = rms_norm_backward(grad, x, weight, inverse)
        return grad_x, grad_weight.to(weight.dtype), None, None


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _RMSNormFunction.apply(x, self.weight, self.eps, norm_dtype(self.weight, x))
