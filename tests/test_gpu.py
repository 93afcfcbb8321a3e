"""The gpu tier: what only a CUDA device can check, run by `make gpu-check` (with `eagle3 preflight` on the smoke
params) and skipped without one. CI without a GPU checks the same calls' signatures and shapes on fake CUDA
tensors (tests/test_attention_fake_cuda.py); these check the numbers the real kernels produce.

No model hub and no PyPI are needed (a GPU machine may have neither): the verifier here is a small random Llama
built from a config, the draft is shaped from it."""

import math
import os
import warnings
from contextlib import contextmanager

import pytest
import torch

from eagle3.formats.checkpoints import CheckpointState, load_checkpoint, save_checkpoint
from eagle3.modeling.attention import ttt_attention
from eagle3.modeling.draft import DraftConfig
from eagle3.modeling.reference_attention import reference_ttt_attention
from eagle3.params.train import DraftMLA, TrainParams
from eagle3.training.distributed import Dist
from eagle3.training.memory import make_objective_for, sample_batch
from eagle3.training.objective import train_step
from eagle3.training.optimizers import make_optimizer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (make gpu-check)"),
]
# cuBLAS picks a workspace per handle, which makes its GEMMs deterministic only with a fixed one; read when the
# first handle is made, so set before any CUDA work in this process (collection imports this module first).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
CUDA = torch.device("cuda")
OPTIMIZERS = ("adamw", "muon")
VERIFIER = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 8,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
}


# A DeepSeek-V3-shaped verifier (MLA, dense layers), the one MLA head size vLLM's CPU and GPU MLA kernels share.
MLA_VERIFIER = {
    **VERIFIER,
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "q_lora_rank": None,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 32,
    "v_head_dim": 32,
}


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach().double(), want.detach().double()
    return float((got - want).norm() / want.norm())


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("tokens, steps, heads, kv_heads, dim", [(1000, 3, 8, 2, 64), (4096, 7, 16, 4, 128)])
def test_cuda_attention_kernels_match_the_fp64_reference(dtype, tolerance, tokens, steps, heads, kv_heads, dim):
    """fp32 (memory-efficient kernel) to 1e-4 and bf16 (flash kernel) to 2e-2 of the norm: bf16's 8-bit mantissa
    rounds each input and output by up to 2^-8 relative."""
    generator = torch.Generator(device=CUDA).manual_seed(tokens + steps)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, device=CUDA, dtype=torch.float64)

    q = randn(1, heads, tokens, dim)
    cache = [(randn(1, kv_heads, tokens, dim), randn(1, kv_heads, tokens, dim)) for _ in range(steps)]
    upstream = randn(1, heads, tokens, dim)
    scale = 1 / math.sqrt(dim)

    def run(attend, precision):
        inputs = [t.to(precision).requires_grad_() for t in (q, *(x for pair in cache for x in pair))]
        pairs = [(inputs[1 + 2 * j], inputs[2 + 2 * j]) for j in range(steps)]
        out = attend(inputs[0], pairs, scale)
        return out, torch.autograd.grad(out, inputs, upstream.to(precision))

    expected, expected_grads = run(reference_ttt_attention, torch.float64)
    actual, grads = run(ttt_attention, dtype)
    assert actual.dtype == dtype and _relative_error(actual, expected) < tolerance
    for index, (got, want) in enumerate(zip(grads, expected_grads, strict=True)):
        assert _relative_error(got, want) < tolerance * 2, f"gradient of input {index}"


def _draft() -> DraftConfig:
    return DraftConfig.from_verifier(VERIFIER, (2, 4, 5), 512)


def _steps(objective, optimizer, batch, count: int) -> None:
    for _ in range(count):
        result = train_step(objective, objective, optimizer, [batch], Dist(device=CUDA), 1.0, "bfloat16")
        assert torch.isfinite(result.loss).item()


def _fresh(recompute: str, optimizer: str = "adamw", config: DraftConfig | None = None):
    torch.manual_seed(0)
    objective = make_objective_for(config or _draft(), 3, recompute, "bfloat16").to(CUDA)
    return objective, make_optimizer(objective.draft, TrainParams(optimizer=optimizer))


def _weights(objective) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in objective.draft.parameters()])


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_a_cuda_training_step_is_the_same_with_and_without_recompute(optimizer):
    """Recompute re-runs the same kernels on the same inputs in the backward: the weights after two steps agree to
    bf16's rounding of the recomputed activations. With Muon (what both shipped configurations train with) too:
    its Newton-Schulz step runs on the GPU here first."""
    batch = {k: v.to(CUDA) for k, v in sample_batch(_draft(), 2, 1024, 3).items()}
    weights = {}
    for recompute in ("off", "mlp", "full"):
        objective, optimizer_ = _fresh(recompute, optimizer)
        _steps(objective, optimizer_, batch, 2)
        weights[recompute] = _weights(objective)
    moved = (weights["off"] - _weights(_fresh("off", optimizer)[0])).norm()
    assert moved > 0
    for recompute in ("mlp", "full"):
        assert float((weights[recompute] - weights["off"]).norm() / moved) < 1e-2, recompute


@contextmanager
def _deterministic():
    """torch's deterministic algorithms for this block only: without them the flash-attention backward accumulates
    dQ with atomics and two identical runs differ in the last bits. Ops that have no deterministic kernel warn
    (warn_only) and are returned, so the test can say which."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.use_deterministic_algorithms(True, warn_only=True)
        nondeterministic: list[str] = []
        try:
            yield nondeterministic
        finally:
            torch.use_deterministic_algorithms(False)
            nondeterministic += sorted({str(w.message).split(".")[0] for w in caught if "determinis" in str(w.message)})


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_resume_on_cuda_continues_as_the_uninterrupted_run(tmp_path, optimizer):
    """Two steps, a checkpoint, two more from it, against four straight. The checkpoint round trip is exact (what
    is loaded is what was saved). The continuation is compared under torch's deterministic algorithms, set for
    this test only (training does not set them: they cost speed, and a resumed run on CUDA therefore differs from an
    uninterrupted one in the last bits, as two uninterrupted runs do): bit for bit where every op then has a
    deterministic kernel; where one has none (named in the failure), within four times the spread of two
    uninterrupted runs."""
    batch = {k: v.to(CUDA) for k, v in sample_batch(_draft(), 2, 512, 3).items()}
    with _deterministic() as nondeterministic:
        straight, optimizer_ = _fresh("off", optimizer)
        _steps(straight, optimizer_, batch, 4)
        again, optimizer_ = _fresh("off", optimizer)
        _steps(again, optimizer_, batch, 4)

        first, optimizer_ = _fresh("off", optimizer)
        _steps(first, optimizer_, batch, 2)
        state = CheckpointState(step=2, total_steps=4, run_key="gpu-test", draft_config=_draft())
        path = save_checkpoint(tmp_path, first.draft, optimizer_, state, keep=1)
        resumed, loaded = _fresh("off", optimizer)
        load_checkpoint(path, resumed.draft, loaded)
        for (name, want), got in zip(
            first.draft.state_dict().items(), resumed.draft.state_dict().values(), strict=True
        ):
            assert torch.equal(got, want), f"{name} loaded other than saved"
        _steps(resumed, loaded, batch, 2)
    spread = float((_weights(again) - _weights(straight)).norm())
    difference = float((_weights(resumed) - _weights(straight)).norm())
    if not nondeterministic:
        assert spread == 0.0, "two uninterrupted runs differ although every op was deterministic"
        assert difference == 0.0, "the resumed run differs from the uninterrupted one"
    else:
        assert difference <= 4 * spread, (difference, spread, nondeterministic)


def test_an_mla_draft_trains_on_cuda_as_on_the_cpu():
    """The MLA draft layer's training step on the GPU (its absorbed attention through the CUDA kernels): the same
    weights and batch give the CPU's loss in float32, and bf16 steps stay finite and learn the fixed batch."""
    config = DraftConfig.from_verifier(MLA_VERIFIER, (2, 4, 5), 512, layer="mla", mla=DraftMLA(q_lora_rank=64))
    batch = sample_batch(config, 2, 512, 3)
    torch.manual_seed(0)
    cpu = make_objective_for(config, 3, "off", "float32")
    gpu = make_objective_for(config, 3, "off", "float32").to(CUDA)
    gpu.load_state_dict(cpu.state_dict())
    losses = []
    for objective in (cpu, gpu):
        device = next(objective.parameters()).device
        optimizer = make_optimizer(objective.draft, TrainParams(optimizer="muon"))
        on_device = {k: v.to(device) for k, v in batch.items()}
        result = train_step(objective, objective, optimizer, [on_device], Dist(device=device), 1.0, "float32")
        losses.append(float(result.loss))
    assert abs(losses[1] - losses[0]) < 1e-4 * abs(losses[0]), losses
    objective, optimizer = _fresh("off", "muon", config)
    on_gpu = {k: v.to(CUDA) for k, v in batch.items()}
    first = float(train_step(objective, objective, optimizer, [on_gpu], Dist(device=CUDA), 1.0, "bfloat16").loss)
    _steps(objective, optimizer, on_gpu, 8)
    last = float(train_step(objective, objective, optimizer, [on_gpu], Dist(device=CUDA), 1.0, "bfloat16").loss)
    assert last < first, (first, last)


def test_hf_capture_on_the_gpu_matches_the_cpu(tmp_path):
    from transformers import LlamaConfig, LlamaModel

    from eagle3.chat.token_layout import Sequence
    from eagle3.engines.hidden_states.hf_capture import HfHiddenStates

    torch.manual_seed(0)
    LlamaModel(LlamaConfig(**VERIFIER)).save_pretrained(tmp_path / "verifier")
    layers = (2, 4, 5, 8)
    capture = HfHiddenStates(tmp_path / "verifier", False, layers, "float32")
    assert capture.on_gpu and capture.device.type == "cuda"
    generator = torch.Generator().manual_seed(1)
    sequences = [
        Sequence(
            sample_id=f"s{n}",
            input_ids=torch.randint(0, 1024, (n,), generator=generator),
            loss_mask=torch.ones(n, dtype=torch.bool),
            truncated=False,
        )
        for n in (17, 300)
    ]
    states = capture.forward(sequences)
    capture.close()
    cpu = LlamaModel.from_pretrained(tmp_path / "verifier", dtype=torch.float32).eval()
    for sequence, got in zip(sequences, states, strict=True):
        with torch.no_grad():
            hidden = cpu(input_ids=sequence.input_ids[None], output_hidden_states=True).hidden_states
        want = torch.stack([hidden[layer][0] for layer in layers]).to(torch.bfloat16)
        assert got.shape == want.shape and got.dtype == torch.bfloat16
        assert _relative_error(got, want) < 1e-2  # fp32 on both; the stored bf16 rounding dominates


def test_nccl_fsdp2_and_a_checkpoint_round_trip_on_one_rank(tmp_path):
    """What an 8-GPU run does on every rank, on one: an NCCL process group, the objective under FSDP2 (DTensor
    parameters, all-gather and reduce-scatter over NCCL), a checkpoint gathered whole and loaded into a plain draft
    that then steps exactly as the sharded one."""
    import socket

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1, device_id=torch.device("cuda", 0)
    )
    try:
        total = torch.ones(1, device=CUDA)
        dist.all_reduce(total)
        assert total.item() == 1.0
        batch = {k: v.to(CUDA) for k, v in sample_batch(_draft(), 2, 512, 3).items()}
        sharded, _ = _fresh("off")
        fully_shard(sharded, mesh=init_device_mesh("cuda", (1,)))
        optimizer = make_optimizer(sharded.draft, TrainParams())
        _steps(sharded, optimizer, batch, 2)
        assert all(isinstance(p, DTensor) for p in sharded.draft.parameters())
        state = CheckpointState(step=2, total_steps=3, run_key="gpu-test", draft_config=_draft())
        path = save_checkpoint(tmp_path, sharded.draft, optimizer, state, keep=1)
        plain, plain_optimizer = _fresh("off")
        load_checkpoint(path, plain.draft, plain_optimizer)
        for (name, want), got in zip(
            sharded.draft.state_dict().items(), plain.draft.state_dict().values(), strict=True
        ):
            assert torch.equal(got, want.full_tensor() if isinstance(want, DTensor) else want), name
        _steps(sharded, optimizer, batch, 1)
        _steps(plain, plain_optimizer, batch, 1)
        for (name, want), got in zip(
            sharded.draft.state_dict().items(), plain.draft.state_dict().values(), strict=True
        ):
            assert torch.equal(got, want.full_tensor() if isinstance(want, DTensor) else want), name
    finally:
        dist.destroy_process_group()
