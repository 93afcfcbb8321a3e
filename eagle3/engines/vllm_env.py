"""Setting up an offline vLLM engine the same way for generate, extract and evaluate.

Every engine runs its core in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0): with the core in its own process,
requests reach it while it is already stepping, so how a batch is scheduled depends on timing and greedy
output drifted between runs (2 of 80 samples here); in-process, a batch is always scheduled the same way, a
resumed run reproduces an uninterrupted one, and the extract stage can drive every engine step itself. Tensor
parallel workers still get processes of their own.
"""

import os
from typing import Any

from eagle3.errors import Eagle3Error


def prepare_environment(cpu_kvcache_space_gib: int) -> None:
    """Call before importing vllm: its environment is read at import time."""
    import torch

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if not torch.cuda.is_available():
        # vLLM's CPU build sizes its KV cache from this variable, not from gpu_memory_utilization.
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cpu_kvcache_space_gib))


def import_vllm(who: str) -> Any:
    """The vllm module, or one clear error naming the setting that asked for it."""
    try:
        import vllm
    except ImportError as exc:
        raise Eagle3Error(f"{who}: cannot import vllm ({exc}); run `make setup`") from None
    return vllm


def engine_args(
    model_dir: str,
    *,
    dtype: str,
    max_model_len: int,
    tensor_parallel_size: int,
    gpu_memory_utilization: float,
    enforce_eager: bool,
    trust_remote_code: bool,
    **extra: Any,
) -> dict[str, Any]:
    """The `vllm.LLM` arguments every engine here shares; `extra` adds the engine's own (seed, speculation...)."""
    return {
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
