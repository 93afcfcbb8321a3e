"""The training attention's CUDA branch without a GPU: its kernel calls on fake CUDA tensors.

Under FakeTensorMode a CPU-only PyTorch build makes tensors on device "cuda" and runs the aten kernels' meta
functions: each call is matched against the kernel's schema (an argument moved, dropped or of the wrong type is
refused) and returns the shapes and dtypes the real kernel returns (the memory-efficient kernel's log-sum-exp
padded along T). The autograd engine does not run on fake CUDA, so forward and backward are called directly. What
this cannot check: the kernels' numerics and runtime conditions (tests marked gpu, on a machine with one).
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from eagle3.modeling.attention import CausalAttentionWithLse

HEADS, KV_HEADS, DIM = 64, 8, 128  # Kimi-K2.5's draft: 64 heads x 128; 8 KV heads exercise the grouping


class SavedFor:
    """The part of autograd's context that CausalAttentionWithLse uses."""

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors


@pytest.mark.parametrize(
    "dtype, kernel",
    [(torch.bfloat16, "flash"), (torch.float16, "flash"), (torch.float32, "efficient")],
)
@pytest.mark.parametrize("tokens", [1000, 16384])  # 1000: not a multiple of the efficient kernel's 32-row blocks
def test_cuda_kernels_take_our_arguments_and_return_the_shapes_we_rely_on(dtype, kernel, tokens):
    scale = DIM**-0.5
    with FakeTensorMode():
        q = torch.empty(1, HEADS, tokens, DIM, device="cuda", dtype=dtype)
        k = torch.empty(1, KV_HEADS, tokens, DIM, device="cuda", dtype=dtype)
        v = torch.empty_like(k)
        ctx = SavedFor()
        out, lse = CausalAttentionWithLse.forward(ctx, q, k, v, scale)
        grads = CausalAttentionWithLse.backward(ctx, torch.empty_like(out), torch.empty_like(lse))

    assert ctx.kind == kernel
    assert (out.shape, out.dtype, out.device.type) == (q.shape, dtype, "cuda")
    # One log-sum-exp per query in fp32: the merge with the own-step scores views it as [B, Hkv, G, T].
    assert (lse.shape, lse.dtype, lse.device.type) == ((1, HEADS, tokens), torch.float32, "cuda")
    grad_q, grad_k, grad_v, grad_scale = grads
    assert grad_scale is None
    for grad, like in ((grad_q, q), (grad_k, k), (grad_v, v)):
        assert (grad.shape, grad.dtype, grad.device.type) == (like.shape, dtype, "cuda")


def test_gradients_arrive_even_when_only_one_output_is_used():
    """Autograd passes None for an output that took no part in the loss; the backward fills in zeros of its shape."""
    with FakeTensorMode():
        q = torch.empty(2, 4, 300, 64, device="cuda", dtype=torch.bfloat16)
        ctx = SavedFor()
        out, lse = CausalAttentionWithLse.forward(ctx, q, q, q, 0.125)
        only_out = CausalAttentionWithLse.backward(ctx, torch.empty_like(out), None)
        only_lse = CausalAttentionWithLse.backward(ctx, None, torch.empty_like(lse))
    for grads in (only_out, only_lse):
        assert [g.shape for g in grads[:3]] == [q.shape] * 3


aten = torch.ops.aten
# Per kernel pair: backward argument -> the forward result it must be, by the schemas' names (the forward's
# output and inputs come back widened by the extra channel; everything else exactly as returned).
SAVED = {
    "flash": {
        "logsumexp": "logsumexp",
        "cum_seq_q": "cum_seq_q",
        "cum_seq_k": "cum_seq_k",
        "max_q": "max_q",
        "max_k": "max_k",
        "philox_seed": "rng_state",
        "philox_offset": "unused",
    },
    "efficient": {"logsumexp": "log_sumexp", "philox_seed": "philox_seed", "philox_offset": "philox_offset"},
}
PAIRS = {
    "flash": (
        aten._scaled_dot_product_flash_attention.default,
        aten._scaled_dot_product_flash_attention_backward.default,
    ),
    "efficient": (
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_efficient_attention_backward.default,
    ),
}


class KernelCalls(TorchDispatchMode):
    """Each call of the attention kernels, its arguments and results by their schema names."""

    def __init__(self):
        super().__init__()
        self.calls = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if any(func in pair for pair in PAIRS.values()):
            bound = dict(zip((a.name for a in func._schema.arguments), args, strict=False)) | (kwargs or {})
            results = result if isinstance(result, tuple) else (result,)
            returned = dict(zip((r.name for r in func._schema.returns), results, strict=True))
            self.calls[func] = (bound, returned)
        return result


@pytest.mark.parametrize("dtype, kernel", [(torch.bfloat16, "flash"), (torch.float32, "efficient")])
def test_the_backward_gets_what_the_forward_returned_where_its_schema_names_it(dtype, kernel):
    """The meta functions accept any tensor where a tensor goes: two of them swapped, or the log-sum-exp passed
    narrowed, would still run there and be wrong on a GPU. Matched by the kernels' own argument names instead."""
    forward_op, backward_op = PAIRS[kernel]
    with FakeTensorMode(), KernelCalls() as recorded:
        q = torch.empty(1, HEADS, 1000, DIM, device="cuda", dtype=dtype)
        k = torch.empty(1, KV_HEADS, 1000, DIM, device="cuda", dtype=dtype)
        ctx = SavedFor()
        out, lse = CausalAttentionWithLse.forward(ctx, q, k, torch.empty_like(k), 0.125)
        CausalAttentionWithLse.backward(ctx, torch.empty_like(out), torch.empty_like(lse))
    (forward_args, forward_results), (backward_args, _) = recorded.calls[forward_op], recorded.calls[backward_op]
    for argument, result in SAVED[kernel].items():
        given, returned = backward_args[argument], forward_results[result]
        same = given is returned if isinstance(returned, torch.Tensor) else given == returned
        assert same, f"{argument} is not the forward's {result}"
    width = -(-(DIM + 1) // 8) * 8
    for argument, source in (("query", "query"), ("key", "key"), ("value", "value"), ("out", "output")):
        expected = (forward_args | forward_results)[source]
        widened = (*expected.shape[:-1], width)
        assert (tuple(backward_args[argument].shape), backward_args[argument].dtype) == (widened, expected.dtype)
    for same in ("dropout_p", "is_causal", "scale"):
        assert backward_args[same] == forward_args[same], same
