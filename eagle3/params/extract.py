"""params.yaml `extract:` — which hidden states are captured and how they are stored."""

from typing import Literal

from pydantic import Field, PositiveInt, field_validator

from eagle3.formats.storage import DEFAULT_STORAGE, StorageName
from eagle3.params.base import Section, Threads, execution_only, pin_environment_setting
from eagle3.precision import EngineDtype


class VllmExtractEngine(Section):
    """Offline `vllm.LLM` engine for extract.backend `vllm` (execution only: changing it resumes, not restarts).
    The context length is max_seq_len + 1 and prefix caching is off, so every token's states are computed."""

    tensor_parallel_size: PositiveInt = 1
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    # vLLM's CPU build sizes its KV cache (hidden-state slots included) from VLLM_CPU_KVCACHE_SPACE (GiB).
    cpu_kvcache_space_gib: PositiveInt = 2
    # Skips torch.compile, which on CPU costs minutes of engine start for little gain.
    enforce_eager: bool = False


class ExtractParams(Section):
    # hf: transformers forward (one process, CPU or one GPU). vllm: vLLM's extract_hidden_states method
    # (eagle3/engines/hidden_states/vllm_capture.py; tensor parallelism, for verifiers too big for one device).
    # Both store the same tensors.
    backend: Literal["hf", "vllm"] = "hf"
    vllm: VllmExtractEngine = execution_only(VllmExtractEngine())
    # vLLM numbering (id k = HF hidden_states[k], 0 = embeddings); null = the verifier's default (2, N//2, N-3).
    # The final layer's (normed) output is always captured after these: training's target distribution comes from it.
    aux_layer_ids: list[int] | None = Field(None, min_length=1)
    # What the verifier's forward pass computes in; the shards store bf16 states either way. auto: bfloat16 where
    # the device computes it natively, else float32 (eagle3/precision.py); the resolved value is in the run key.
    dtype: EngineDtype = "auto"
    splits: list[Literal["train", "heldout"]] = Field(["train", "heldout"], min_length=1)
    max_seq_len: PositiveInt = 2048
    # Sequences are batched up to this many (padded) tokens per forward pass.
    batch_tokens: PositiveInt = 8192
    # A shard closes once its raw hidden states reach this size (~1 GB at scale; a shard is the unit of resume).
    # Batches run shortest first within a shard and are written back in plan order: up to one shard's raw
    # states wait in memory.
    shard_raw_mb: PositiveInt = 1024
    # How hidden states are stored (eagle3/formats/shards.py; docs/pipeline.md "extract" has the trade-off):
    # bf16-lossless (byte planes, zstd); 8-bit floats with a scale per token, per role (the aux layers are
    # the draft's input, the final layer defines its targets): fp8-aux (aux e4m3, final lossless), fp8 (both
    # e4m3), fp8-compact (aux e5m2, final e4m3). Training reads bf16 whatever is stored.
    storage: StorageName = DEFAULT_STORAGE
    compression_level: int = Field(1, ge=1, le=19)
    compression_threads: Threads = execution_only(2)
    # Refuse to start unless the output filesystem keeps this much free after the estimated shards.
    reserve_free_gb: float = execution_only(1.0, ge=0)
    # Skip the free-space check entirely (e.g. on filesystems that report no meaningful free space).
    ignore_disk_check: bool = execution_only(False)
    pin_environment: bool = pin_environment_setting()

    @field_validator("aux_layer_ids")
    @classmethod
    def _non_negative_ascending(cls, ids: list[int] | None) -> list[int] | None:
        # vLLM concatenates the captured layers in ascending order whatever order the draft's config lists them in.
        if ids is not None and (min(ids) < 0 or ids != sorted(set(ids))):
            raise ValueError(f"layer ids must be distinct, >= 0 and ascending, got {ids}")
        return ids
