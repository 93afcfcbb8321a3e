"""`eagle3 plan`'s fixed facts and its inputs' types: units, GPU and verifier presets, the trainer's measured speed,
the machines and the resolved `Inputs` (eagle3/plan/inputs.py fills them in); and `to_json`, the one way the
plan's dataclasses become its JSON."""

from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from eagle3.gpu_kinds import GPUS

GB, TB = 1e9, 1e12
# vLLM's default gpu_memory_utilization: the share of GPU memory it takes, weights and KV cache together.
GPU_MEMORY_UTILIZATION = 0.9
CACHE_LINKS = {"hardlink": 1, "reflink": 1, "symlink": 1, "copy": 2}

# Field metadata for `to_json`: a figure the formulas share that the JSON does not show under its object.
NOT_IN_JSON = {"json": False}
# Field metadata for `to_json`: a dataclass whose fields stand in its parent's object, not under its own key.
INLINE = {"inline": True}


def to_json(value: object) -> Any:
    """Dataclasses as objects of their fields in declaration order (see NOT_IN_JSON and INLINE), dicts and
    sequences item by item, anything else as it is."""
    if is_dataclass(value):
        data: dict[str, Any] = {}
        for item in fields(value):
            if item.metadata.get("json", True):
                converted = to_json(getattr(value, item.name))
                data |= converted if item.metadata.get("inline") else {item.name: converted}
        return data
    if isinstance(value, dict):
        return {key: to_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(item) for item in value]
    return value


def size(value: float | None) -> str:
    if value is None:
        return "n/a"
    if value >= TB:
        return f"{value / TB:,.2f} TB"
    return f"{value / GB:,.1f} GB" if value >= GB else f"{value / 1e6:,.1f} MB"


def dollars(value: float) -> str:
    return f"${value:,.0f}" if value >= 10 else f"${value:,.2f}"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    if seconds >= 3600:
        return f"{seconds / 3600:,.1f} h"
    return f"{seconds / 60:,.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


@dataclass(frozen=True)
class VerifierShape:
    name: str
    hidden_size: int
    num_layers: int
    vocab_size: int
    intermediate_size: int
    total_params: float | None
    active_params: float | None
    weights_bytes: float | None
    # The language model's config.json keys, from which the draft is shaped for the training-memory estimate.
    config: dict[str, Any] = field(default_factory=dict, metadata=NOT_IN_JSON, compare=False)

    @property
    def known_weights_bytes(self) -> float:
        """weights_bytes, which every plan has (verifier_from_args refuses a verifier without it)."""
        if self.weights_bytes is None:
            raise ValueError(f"verifier {self.name}: weights size unknown")
        return self.weights_bytes


# Kimi-K2.5's language model (its config.json `text_config`) as far as shaping the draft reads it: MLA (it has
# kv_lora_rank), so the draft gets 64 heads x 128 (eagle3/modeling/draft.py DraftConfig.from_verifier).
KIMI_K2_5_TEXT_CONFIG = {
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "num_hidden_layers": 61,
    "vocab_size": 163840,
    "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "rope_theta": 50000.0,
    "rope_scaling": {
        "type": "yarn",
        "rope_type": "yarn",
        "factor": 64.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
}

PRESETS = {
    # Kimi-K2.5 (DeepSeek-V3 architecture): dense MLP width 18432; ~1.03T parameters, 32B active per token; the
    # published checkpoint (int4 routed experts) is ~600 GB.
    "kimi-k2.5": VerifierShape(
        "moonshotai/Kimi-K2.5", 7168, 61, 163840, 18432, 1.03e12, 32e9, 600 * GB, KIMI_K2_5_TEXT_CONFIG
    ),
}


@dataclass(frozen=True)
class TrainMeasurement:
    gpu: str
    tokens_per_s: float
    sample_tokens: int
    ttt_steps: int
    draft_vocab: int


# This project's draft trainer at Kimi-K2.5's shape on one GPU, bf16 autocast, fused AdamW, batch 1
# (benchmarks/train_gpu.py: an EAGLE-3 draft, its default 32,000-token draft vocabulary), measured before its
# attention became linear in T (its memory: eagle3/plan/memory.py).
TRAIN_MEASURED = TrainMeasurement("h200", 7134.0, 2048, 7, 32000)


@dataclass(frozen=True)
class MemoryLine:
    """Training memory per GPU at one train.activation_checkpointing setting: fixed + per_token * T bytes."""

    fixed_bytes: float
    bytes_per_token: float


@dataclass(frozen=True)
class MemoryEstimate:
    """eagle3/plan/memory.py's lines per setting (None where the verifier's config cannot shape a draft:
    `source` says why)."""

    ttt_steps: int
    processes: int
    sharding: str
    lines: dict[str, MemoryLine] | None
    source: str
    # The draft layout's switched-on norms (train.draft_layout); none: the 2024 layout.
    draft_layout: tuple[str, ...] = ()


@dataclass(frozen=True)
class Machine:
    gpu: str
    gpus: int
    tflops: float
    usd_per_gpu_hour: float
    disk_tb: float | None

    @property
    def memory_gb(self) -> float:
        return GPUS[self.gpu].memory_gb


def weights_fit(weights_bytes: float, machine: Machine) -> bool:
    """Whether vLLM can load the verifier on `machine`: its weights within the share of GPU memory vLLM takes."""
    return weights_bytes <= machine.gpus * machine.memory_gb * GB * GPU_MEMORY_UTILIZATION


@dataclass(frozen=True)
class DraftFigures:
    """The draft the train stage builds for these inputs, sized on the meta device (shapes only, in milliseconds):
    the figures the plan and `eagle3 check` quote of it, none from a formula of their own."""

    parameters: int  # every parameter it holds, trained or not
    trained_parameters: int
    checkpoint_bytes: int  # one checkpoint's tensors (eagle3/formats/checkpoints.py checkpoint_bytes)
    served_bytes: int  # the exported draft: weights in bf16 and its vocabulary maps (int64 d2t, bool t2d: as exported)
    newton_schulz_flops: float  # one Muon step's orthogonalisation on each process; 0 for adamw


@dataclass(frozen=True)
class Budget:
    low: float | None
    high: float


@dataclass(frozen=True)
class Inputs:
    verifier: VerifierShape
    samples: int
    mean_tokens: float
    max_tokens: int
    # The most padded tokens one training process holds at once (eagle3/training/data.py tokens_per_process):
    # what the training memory is sized at.
    process_tokens: int
    captured_layers: int
    bytes_per_element: int
    compression_ratio: float
    link_gbit: float
    link_efficiency: float
    weights_link_gbit: float
    # The DVC remote's speeds, Gbit/s as reached (no efficiency applied): here -> remote, and the rented machine's.
    remote_up_gbit: float
    remote_down_gbit: float
    # sha256 over a buffer in memory on one thread of this machine: how fast the weights' identity is hashed (a
    # measurement that varies from run to run: in the sources, not the JSON).
    sha256_bytes_per_s: float = field(metadata=NOT_IN_JSON)
    there: Machine
    here: Machine
    here_share: float
    mfu: float
    there_tokens_per_s: float | None
    here_tokens_per_s: float | None
    here_usd_per_hour: float
    train_tokens_per_s_per_gpu: float | None
    # train.optimizer, the samples an optimizer step takes (train.batch_size, fewer where train.max_tokens_per_batch
    # holds fewer of the mean length), one step's seconds as preflight measured it (None: derived from its FLOPs)
    # and its FLOPs (Muon's Newton-Schulz; 0 for adamw, whose step the training rate includes).
    optimizer: str
    samples_per_step: float
    optimizer_step_s: float | None
    optimizer_step_flops: float
    epochs: int
    draft_vocab: int
    keep_checkpoints: int
    # The train stage's draft for these inputs (eagle3/plan/memory.py draft_figures): its sizes.
    draft: DraftFigures = field(metadata=NOT_IN_JSON)
    stream_buffer_gb: float
    headroom: float
    cache_link: str
    # extract.storage the ratio is for, and every storage's ratio (the plan shows each beside the chosen one).
    storage: str
    storage_ratios: dict[str, float]
    budget_usd: Budget | None
    budget_hours: Budget | None
    link_measurement: dict[str, Any] | None
    train_memory: MemoryEstimate
    # train.activation_checkpointing the memory check holds to, and the layout the params are set for (C:
    # streamed states; "A or B": stored; None: no params file).
    recompute: str
    configured_layout: str | None
    sources: dict[str, str]
    # Each input the configuration decides (plan_config.CONFIGURED): where its value came from.
    configuration: dict[str, str]
    # What the runbook's steps count: answers, evaluation turns, server starts (eagle3/plan/work.py).
    work: Any
    # Output tokens/s of a `vllm serve` of the verifier here (generate's measured rate, or given); None: assumed.
    serve_tokens_per_s: float | None
    # Seconds to start the verifier (a server or an engine); None: from its weights' size.
    server_start_s: float | None
    # Layout C as the params set it (the verifier's share of each GPU, phases or not); None: sized as `eagle3 init
    # --layout C` would for --gpu.
    streamed_share: float | None
    streamed_phases: bool | None
    # The plan shows them at its top, before every figure, not among the inputs.
    warnings: list[str] = field(metadata=NOT_IN_JSON)
