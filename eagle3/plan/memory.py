"""`eagle3 plan`'s training memory: what one GPU of the rented kind holds while training the draft, and the longest
sample that trains there with each train.activation_checkpointing setting.

The figures are eagle3/training/memory.py's estimate (the real training step run on fake tensors: bf16 autocast,
train.optimizer's state, batch 1, the draft shaped from the verifier's config as the train stage shapes it) for one
of `gpus` processes under --sharding (Muon's Newton-Schulz temporaries come after the backward has freed the step's
activations), and preflight measures the configured optimizer itself. It is linear in the sample's length, so two
measured lengths give each setting's line:

    memory(T)           = fixed + per_token * T                     (per GPU, each setting)
    longest sample      = floor((memory_gb * 1e9 - fixed) / per_token)
    fits                = memory(max_tokens) <= memory_gb * 1e9

memory_gb is the preset's (NVIDIA's figure, about GiB): counted as 1e9 bytes, it leaves ~7% for the CUDA context
and the caching allocator's slack. Estimating imports torch and transformers and runs six fake steps, so the lines
are kept under $XDG_CACHE_HOME/eagle3 (~/.cache/eagle3), keyed by everything they depend on, this package's source
included.
"""

import hashlib
import importlib.metadata
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3.errors import Eagle3Error
from eagle3.files import write_json
from eagle3.formats.hf_config import text_config
from eagle3.gpu_kinds import GPUS
from eagle3.params.train import RECOMPUTE
from eagle3.plan.facts import GB, DraftFigures, Machine, MemoryEstimate, MemoryLine, to_json

LENGTHS = (4096, 8192)
_PACKAGE = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class SettingMemory:
    at_max_tokens_bytes: float
    fits: bool
    longest_tokens: int
    # The line's fixed part: weights, AdamW state, gradients, the verifier's embedding and head, held between steps.
    resting_bytes: float


@dataclass(frozen=True)
class TrainMemory:
    gpu: str
    memory_bytes: float
    ttt_steps: int
    processes: int
    sharding: str
    settings: dict[str, SettingMemory] | None
    source: str
    draft_layout: tuple[str, ...] = ()


def _cache_key(
    config: dict[str, Any],
    draft_vocab: int,
    ttt_steps: int,
    processes: int,
    sharding: str,
    shape: dict[str, Any],
    aux_layers: int | None,
) -> str:
    source = hashlib.sha256()
    for path in sorted(_PACKAGE.rglob("*.py")):
        source.update(path.read_bytes())
    versions = {name: importlib.metadata.version(name) for name in ("torch", "transformers")}
    inputs = [config, draft_vocab, ttt_steps, processes, sharding, shape, aux_layers, LENGTHS, versions]
    return hashlib.sha256(json.dumps([*inputs, source.hexdigest()], sort_keys=True).encode()).hexdigest()[:32]


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "eagle3" / "plan-train-memory"


def _measure(
    config: dict[str, Any],
    draft_vocab: int,
    ttt_steps: int,
    processes: int,
    sharding: str,
    shape: dict[str, Any],
    aux_layers: int | None,
) -> dict[str, MemoryLine]:
    from eagle3.modeling.draft import DraftConfig
    from eagle3.params.train import TrainParams
    from eagle3.training.memory import Estimator, draft_config_for

    train = TrainParams.model_validate(shape)
    draft = draft_config_for(config, draft_vocab, train, aux_layers)
    estimator = Estimator(
        draft, ttt_steps, optimizer=train.optimizer, freeze_lm_head=train.freeze_lm_head, anchors=train.dflash.anchors
    )
    lines = {}
    for setting in RECOMPUTE if isinstance(draft, DraftConfig) else ("off",):
        short, long = (estimator.memory(tokens, setting, processes, sharding).total for tokens in LENGTHS)
        per_token = (long - short) / (LENGTHS[1] - LENGTHS[0])
        lines[setting] = MemoryLine(short - per_token * LENGTHS[0], per_token)
    return lines


def draft_figures(
    config: dict[str, Any], draft_vocab: int, shape: dict[str, Any], aux_layers: int | None = None
) -> DraftFigures:
    """DraftFigures for the verifier `config`, draft vocabulary and train settings `shape` (draft_settings: the
    draft's shape, the optimizer and whether the head trains), on `aux_layers` captured aux layers (None: vLLM's
    default three)."""
    import torch

    from eagle3.formats.checkpoints import checkpoint_bytes
    from eagle3.modeling.drafts import draft_for
    from eagle3.params.train import TrainParams
    from eagle3.training.memory import draft_config_for
    from eagle3.training.optimizers import make_optimizer, newton_schulz_flops

    train = TrainParams.model_validate(shape)
    try:
        with torch.device("meta"):
            draft = draft_for(draft_config_for(config, draft_vocab, train, aux_layers))
    except (KeyError, ValueError) as exc:  # transformers' own validation of the shape
        raise Eagle3Error(f"the verifier's config cannot shape the draft: {exc}") from None
    draft.lm_head.weight.requires_grad_(not train.freeze_lm_head)
    optimizer = make_optimizer(draft, train)
    parameters = sum(p.numel() for p in draft.parameters())
    return DraftFigures(
        parameters=parameters,
        trained_parameters=sum(p.numel() for p in draft.parameters() if p.requires_grad),
        checkpoint_bytes=checkpoint_bytes(draft, optimizer),
        served_bytes=2 * parameters
        + _vocab_map_bytes(train.draft_method, draft_vocab, text_config(config)["vocab_size"]),
        newton_schulz_flops=newton_schulz_flops(draft) if train.optimizer == "muon" else 0.0,
    )


def _vocab_map_bytes(method: str, draft_vocab: int, vocab: int) -> int:
    """The exported vocabulary maps: an EAGLE-3 draft's d2t (int64) and t2d (bool); a block draft's d2t only where
    its vocabulary is pruned (eagle3/formats/exported_dflash.py)."""
    if method == "dflash":
        return 8 * draft_vocab if draft_vocab < vocab else 0
    return 8 * draft_vocab + vocab


def training_matmul_flops(draft: Any, ttt_steps: int, anchors: int, tokens: int) -> float:
    """Matmul FLOPs per sample token of one training step of `draft` (built on the meta device) on `tokens`-token
    samples: 2 x 3 per trained weight a token passes through (the forward, and the backward's two products), 2 per
    verifier head row (the soft targets, forward only). A chain draft passes each token through fc once and through
    its layer and head at each of `ttt_steps`; a block draft projects every token into each layer's context keys and
    values and runs min(anchors, tokens) blocks of block_size queries through its layers, its head on the predicted
    slots. Attention's own products, linear in the context for both, are left out."""
    from torch import nn

    from eagle3.modeling.dflash import DFlashAttention, DFlashDraft

    def weights(module: nn.Module) -> int:
        return sum(m.weight.numel() for m in module.modules() if isinstance(m, nn.Linear))

    head = draft.lm_head.weight.numel()
    if isinstance(draft, DFlashDraft):
        size, blocks = draft.config.block_size, min(anchors, tokens)
        projected = [m for m in draft.layers.modules() if isinstance(m, DFlashAttention)]
        context = draft.fc.weight.numel() + sum(m.k_proj.weight.numel() + m.v_proj.weight.numel() for m in projected)
        trained = context + blocks * (size * weights(draft.layers) + (size - 1) * head) / tokens
    else:
        trained = draft.fc.weight.numel() + ttt_steps * (weights(draft.midlayer) + head)
    return 6 * trained + 2 * head


def block_draft_train_rate(
    config: dict[str, Any], draft_vocab: int, shape: dict[str, Any], tokens: int, aux_layers: int | None
) -> tuple[float, str]:
    """A block draft's training tokens/s on TRAIN_MEASURED's GPU, from the measured chain draft's rate scaled by
    the two steps' matmul FLOPs per token (`training_matmul_flops`, each draft built as the trainer builds it), and
    the words saying so."""
    import torch

    from eagle3.modeling.drafts import draft_for
    from eagle3.params.train import TrainParams
    from eagle3.plan.facts import KIMI_K2_5_TEXT_CONFIG, TRAIN_MEASURED
    from eagle3.training.memory import draft_config_for

    train = TrainParams.model_validate(shape)
    measured = TRAIN_MEASURED
    with torch.device("meta"):
        chain = draft_for(draft_config_for(KIMI_K2_5_TEXT_CONFIG, measured.draft_vocab))
        block = draft_for(draft_config_for(config, draft_vocab, train, aux_layers))
    ratio = training_matmul_flops(chain, measured.ttt_steps, 0, measured.sample_tokens) / training_matmul_flops(
        block, 0, train.dflash.anchors, tokens
    )
    words = (
        f"the chain draft's measured rate x {ratio:.3f}, the measured step's matmul FLOPs per token over this block "
        f"draft's at {tokens:,}-token samples ({train.dflash.layers} layers, blocks of {train.dflash.block_size} at "
        f"{train.dflash.anchors} anchors; estimated, not measured)"
    )
    return measured.tokens_per_s * ratio, words


def _cached(path: Path) -> dict[str, MemoryLine] | None:
    """The lines kept at `path`, in the settings' order (a block draft's: off only); None where there are none (or
    not what _measure makes)."""
    try:
        data = json.loads(path.read_text())
        if not data or set(data) - set(RECOMPUTE):
            return None
        return {
            name: MemoryLine(float(data[name]["fixed_bytes"]), float(data[name]["bytes_per_token"]))
            for name in RECOMPUTE
            if name in data
        }
    except (OSError, ValueError, KeyError, TypeError):
        return None


def estimate(
    config: dict[str, Any],
    draft_vocab: int,
    ttt_steps: int,
    processes: int,
    sharding: str,
    shape: dict[str, Any] | None = None,
    aux_layers: int | None = None,
) -> MemoryEstimate:
    """The lines, from the cache or measured (and cached), for the draft `shape` (draft_settings of the train
    params; None: the defaults) gives, on `aux_layers` captured aux layers (None: vLLM's default three). A block
    draft's (train.draft_method dflash) trains its block's slots, not `ttt_steps`, and recomputes nothing: its one
    line is `off`'s."""
    shape = shape or {}
    draft_layout = tuple(name for name, on in (shape.get("draft_layout") or {}).items() if on)
    words = (
        f"eagle3/training/memory.py on fake tensors: {ttt_steps} TTT steps, bf16, batch 1, one of {processes} "
        f"processes ({sharding}), draft layout: {', '.join(draft_layout) or 'no extra norms'}" + _shape_words(shape)
    )
    if shape.get("draft_method") == "dflash":
        from eagle3.params.train import DFlashParams

        block = DFlashParams.model_validate(shape.get("dflash") or {})
        ttt_steps, draft_layout = block.block_size - 1, ()
        words = (
            f"eagle3/training/memory.py on fake tensors: a DFlash draft of {block.layers} layers, blocks of "
            f"{block.block_size} at {block.anchors} anchors per sample, bf16, batch 1, one of {processes} processes "
            f"({sharding})" + _shape_words({**shape, "attention": None})
        )
    key = (config, draft_vocab, ttt_steps, processes, sharding, shape, aux_layers)
    try:
        path = _cache_dir() / f"{_cache_key(*key)}.json"
        lines = _cached(path)
        if lines is None:
            lines = _measure(*key)
            try:
                write_json(path, to_json(lines))
            except OSError:
                pass  # a read-only cache only costs the next plan the measurement again
    except Eagle3Error as exc:
        return MemoryEstimate(ttt_steps, processes, sharding, None, f"not estimated: {exc}", draft_layout)
    return MemoryEstimate(ttt_steps, processes, sharding, lines, words, draft_layout)


def _shape_words(shape: dict[str, Any]) -> str:
    """The draft's attention and MLP settings where they are not derived from the verifier."""
    attention = {key: value for key, value in (shape.get("attention") or {}).items() if value is not None}
    if shape.get("draft_layer") == "mla":
        attention |= {key: value for key, value in (shape.get("mla") or {}).items() if value is not None}
    words = ["MLA draft layer"] if shape.get("draft_layer") == "mla" else []
    words += [f"MLP width {shape['intermediate_size']}"] if shape.get("intermediate_size") else []
    words += [f"attention {', '.join(f'{key} {value}' for key, value in attention.items())}"] if attention else []
    return "".join(f", {word}" for word in words)


def compute_train_memory(estimate_: MemoryEstimate, max_tokens: int, machine: Machine) -> TrainMemory:
    """Per setting: the memory at max_tokens, whether it fits one GPU of `machine`, the longest sample that does."""
    memory = machine.memory_gb * GB
    settings = None
    if estimate_.lines is not None:
        settings = {}
        for name, line in estimate_.lines.items():
            at_max = line.fixed_bytes + line.bytes_per_token * max_tokens
            longest = max(0, math.floor((memory - line.fixed_bytes) / line.bytes_per_token))
            settings[name] = SettingMemory(at_max, at_max <= memory, longest, line.fixed_bytes)
    return TrainMemory(
        machine.gpu,
        memory,
        estimate_.ttt_steps,
        estimate_.processes,
        estimate_.sharding,
        settings,
        estimate_.source,
        estimate_.draft_layout,
    )


def memory_warning(train: TrainMemory, max_tokens: int, recompute: str) -> str | None:
    """What to set (or that nothing fits) when `max_tokens` at once per training process (tokens_per_process) do
    not train with the configured recompute."""
    if train.settings is None or train.settings[recompute].fits:
        return None
    gpu = GPUS[train.gpu]
    need = {name: f"{setting.at_max_tokens_bytes / GB:,.0f} GB" for name, setting in train.settings.items()}
    where = f"one {gpu.name} ({gpu.memory_gb:g} GB, {train.processes} x {train.sharding})"
    fitting = [name for name in RECOMPUTE if name in train.settings and train.settings[name].fits]
    if "full" not in train.settings:  # a block draft recomputes nothing: only shorter samples fit
        return (
            f"{max_tokens:,} tokens per training process need {need[recompute]} per GPU, more than {where} holds "
            f"(estimated); the longest that trains is {train.settings[recompute].longest_tokens:,} tokens: lower "
            "extract.max_seq_len or train.max_tokens_per_batch"
        )
    if fitting:
        return (
            f"{max_tokens:,} tokens per training process need {need[recompute]} per GPU to train with "
            f"train.activation_checkpointing: {recompute}, more than {where} holds; set it to {fitting[0]} "
            f"({need[fitting[0]]}, estimated)"
        )
    return (
        f"{max_tokens:,} tokens per training process do not train on {where} even with "
        "train.activation_checkpointing: full "
        f"({need['full']}, estimated); the longest that does is {train.settings['full'].longest_tokens:,} tokens"
    )
