"""Setting up an offline vLLM engine the same way for generate, extract and evaluate.

Every engine runs its core in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0): with the core in its own process,
requests reach it while it is already stepping, so how a batch is scheduled depends on timing and greedy
output drifted between runs (2 of 80 samples here); in-process, a batch is always scheduled the same way, a
resumed run reproduces an uninterrupted one, and the extract stage can drive every engine step itself. Tensor
parallel workers still get processes of their own.
"""

import os
from pathlib import Path
from typing import Any

from eagle3.errors import Eagle3Error
from eagle3.formats.hf_config import read_config, text_config, uses_mla
from eagle3.precision import engine_device_type


def prepare_environment(cpu_kvcache_space_gib: int) -> None:
    """Call before importing vllm: its environment is read at import time."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if on_cpu_build():
        # vLLM's CPU build sizes its KV cache from this variable, not from gpu_memory_utilization.
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cpu_kvcache_space_gib))


def import_vllm(who: str) -> Any:
    """The vllm module, or one clear error naming the setting that asked for it."""
    try:
        import vllm
    except ImportError as exc:
        raise Eagle3Error(f"{who}: cannot import vllm ({exc}); run `make setup`") from None
    return vllm


def start_engine(
    vllm: Any,
    who: str,
    model_dir: str,
    *,
    dtype: str,
    max_model_len: int,
    tensor_parallel_size: int,
    gpu_memory_utilization: float,
    enforce_eager: bool,
    trust_remote_code: bool,
    **extra: Any,
) -> Any:
    """A `vllm.LLM` with the arguments every engine here shares; `extra` adds the engine's own (seed,
    speculation...). vLLM failing to start is reported as one line with its own error.

    A multimodal wrapper (Kimi-K2.5: KimiK25ForConditionalGeneration, its language model in `text_config`) runs
    with language_model_only: every stage here reads and writes text, and the vision tower is never loaded."""
    config = read_config(Path(model_dir), "the verifier must be a Hugging Face model directory")
    if text_config(config) is not config:
        extra = {"language_model_only": True, **extra}
    if on_cpu_build() and uses_mla(text_config(config)) and "max_num_batched_tokens" not in extra:
        extra = {**cpu_mla_whole_prefills(max_model_len, tensor_parallel_size), **extra}
    if on_cpu_build():
        extra = {**extra, **cpu_mla_backends(config, dtype, extra.get("speculative_config"))}
        if (extra.get("speculative_config") or {}).get("method") == "dflash":
            repair_dflash_context_norm()
    arguments = {
        "model": model_dir,
        "tokenizer": model_dir,
        "dtype": dtype,
        "max_model_len": max_model_len,
        "tensor_parallel_size": tensor_parallel_size,
        "gpu_memory_utilization": gpu_memory_utilization,
        "enforce_eager": enforce_eager,
        "trust_remote_code": trust_remote_code,
        **extra,
    }
    try:
        return vllm.LLM(**arguments)
    except Exception as exc:  # vLLM's own failure, whatever its type: one line that names it
        message = " ".join(str(exc).split())[:500]
        hint = ""
        if "language_model_only" in extra and on_cpu_build():
            hint = (
                "; vLLM's CPU build cannot start a multimodal wrapper (text_config) with the engine core in-process, "
                "as these stages run it (its CPU platform's triton kernel overrides fail; docs/troubleshooting.md): "
                "on CPU rehearse with the plain text checkpoint; GPUs do not take that path"
            )
        raise Eagle3Error(f"{who}: vLLM could not start {model_dir}: {type(exc).__name__}: {message}{hint}") from None


# vLLM's CPU default step budget of an offline engine, per tensor-parallel rank (engine/arg_utils.py).
CPU_STEP_TOKENS_PER_RANK = 4096


def whole_prefills(step_tokens: int) -> dict[str, Any]:
    """Engine arguments for one step per prompt: chunked prefill off, which vLLM accepts only with a step budget
    (`step_tokens`) of at least the context length."""
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": step_tokens}


def cpu_mla_whole_prefills(max_model_len: int, tensor_parallel_size: int) -> dict[str, Any]:
    """vLLM-CPU runs MLA without chunked prefill, but turns it off only after the scheduler has taken its per-step
    budget from the chunked default (4,096 tokens): a longer prompt then never fits a step and the engine waits
    forever. Asked for at start, whole prefills come with a budget that holds the longest prompt."""
    return whole_prefills(max(max_model_len, CPU_STEP_TOKENS_PER_RANK * tensor_parallel_size))


# vLLM-CPU's MLA backends (vllm/platforms/cpu.py, get_attn_backend_cls): AMX_MLA, taken for every MLA layer
# wherever the CPU has AMX tiles unless CPU_MLA is asked for, packs only these weight dtypes and fails on any other
# after the weights have loaded; CPU_MLA, the reference backend, takes every dtype.
AMX_MLA_DTYPES = ("bfloat16", "float16")
CPU_MLA = "CPU_MLA"


def cpu_mla_backends(verifier_config: dict[str, Any], dtype: str, speculative_config: Any) -> dict[str, Any]:
    """Engine arguments that put every MLA layer, the verifier's and an MLA draft's, on vLLM-CPU's reference MLA
    backend when the engine computes in a dtype the AMX backend refuses; nothing otherwise (vLLM's own choice,
    AMX where the CPU has it). The draft needs its own pin: vLLM's proposer never inherits the verifier's attention
    backend and picks again from `speculative_config["attention_backend"]` (llm_base_proposer.py).

    Pinned on every CPU, not only where AMX is detected: the engine then runs the same kernels whatever CPU it
    lands on, which is what the tests compare."""
    if dtype in AMX_MLA_DTYPES or os.environ.get("VLLM_MLA_DISABLE") == "1":
        return {}
    pins: dict[str, Any] = {}
    if uses_mla(text_config(verifier_config)):
        pins["attention_config"] = {"backend": CPU_MLA}
    draft = (speculative_config or {}).get("model") if isinstance(speculative_config, dict) else None
    if draft and (Path(draft) / "config.json").is_file() and uses_mla(text_config(read_config(Path(draft)))):
        pins["speculative_config"] = {**speculative_config, "attention_backend": CPU_MLA}
    return pins


def repair_dflash_context_norm() -> bool:
    """vLLM-CPU 0.32 normalises every layer's context keys of a DFlash draft with the first layer's k_norm: its
    DFlash model stacks the layers' k_norm weights [layers, head_dim] for one grouped rms_norm, and the CPU kernel
    reads only the first row (CUDA's reads each layer's). A multi-layer block draft then serves otherwise than it
    was trained. The kernel is probed on a known input; only where it is wrong is the grouped norm computed in torch
    instead, per layer. True where it replaced it."""
    import torch
    from vllm import _custom_ops as ops
    from vllm.model_executor.models.qwen3_dflash import DFlashQwen3Model

    x = torch.linspace(-1.0, 1.0, 2 * 16).reshape(2, 1, 1, 16)
    weight = torch.stack([torch.ones(16), torch.full((16,), 2.0)])
    out = torch.empty_like(x)
    ops.rms_norm(out, x, weight, 1e-6)
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight[:, None, None, :]
    if torch.allclose(out, expected, atol=1e-5):
        return False

    def normalize_per_layer(self, all_k: torch.Tensor) -> torch.Tensor:  # [layers, tokens, kv heads, head_dim]
        wide = all_k.float()
        normed = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self._rms_norm_eps)
        return (normed * self._k_norm_weights.float()[:, None, None, :]).to(all_k.dtype)

    DFlashQwen3Model._normalize_context_k = normalize_per_layer  # type: ignore[method-assign]  # the repair itself
    return True


def on_cpu_build() -> bool:
    """No CUDA device: the engines here run on vLLM's CPU build (vllm-cpu)."""
    return engine_device_type() == "cpu"
