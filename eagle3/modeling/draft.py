"""The EAGLE-3 draft: one Llama decoder layer over the verifier's aux hidden states, as vLLM runs it.

Parameter names are vLLM's classic EAGLE-3 checkpoint names (llama_eagle3.py),
so export is a rename-free save:

    input_norm.weight [3H]                 norm_before_fc only: one RMSNorm over the concatenated aux states
    fc_norm.{i}.weight [H]                 fc_norm only: one RMSNorm per aux layer's states
    fc.weight [H, 3H]                      aux states (in eagle_aux_hidden_state_layer_ids order) -> H
    midlayer.input_layernorm.weight [H]    applied to the token embedding
    midlayer.hidden_norm.weight [H]        applied to the hidden state
    midlayer.self_attn.{q,k,v}_proj [*, 2H] input = cat(input_layernorm(embed), hidden_norm(h)), embedding FIRST
    midlayer.self_attn.o_proj, midlayer.post_attention_layernorm, midlayer.mlp.{gate,up,down}_proj
    norm.weight [H], lm_head.weight [draft_vocab, H]

One step, as vLLM runs it with the layout's switches (DraftLayout): residual = h, or
hidden_norm(h) with norm_before_residual; r = o_proj(attn) + residual;
pre = mlp(post_attention_layernorm(r)) + r; logits = lm_head(norm(pre)); the next
draft step receives `pre`, or norm(pre) with norm_output.
Step 0 feeds h = fc(aux) with the token one ahead (position t sees token t+1);
step i feeds step i-1's output with the token i+1 ahead at rope position t+i
(eagle3/modeling/ttt_alignment.py has the shift) and attends to step 0's
keys/values of positions <= t plus its own keys/values from steps 1..i:
exactly the draft's KV cache in vLLM.

`aux_scale` divides fc's input per channel during training (the aux states
have channels averaging 100-350 and positions with norm ~25,000); export folds
it into fc.weight, so the published format is unchanged. A layout with an aux
norm (fc_norm, norm_before_fc) keeps it at ones: the norm already removes each
position's scale, and a division before a norm could not be folded into fc.
"""

import functools
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from eagle3.errors import Eagle3Error
from eagle3.formats.hf_config import text_config, uses_mla
from eagle3.modeling.attention import ttt_attention
from eagle3.modeling.mla_attention import MLAAttention
from eagle3.modeling.norms import RMSNorm
from eagle3.modeling.rope import MLA_VERIFIER_DRAFT_THETA, ROPE_KEYS, draft_rope, rotary_rope
from eagle3.modeling.ttt_alignment import input_offset, shift_left
from eagle3.params.train import RECOMPUTE, DraftAttention, DraftLayer, DraftLayout, DraftMLA, TrainParams

# An MLA verifier's Llama-style draft (train.attention's docs): the shape of published Kimi-K2.5 drafts.
MLA_HEAD_DIM, MLA_HIDDEN_PER_HEAD = 128, 112
# The MLA draft layer's shape, under vLLM's (and transformers' DeepseekV2Config's) names.
MLA_KEYS = tuple(DraftMLA.model_fields)


@dataclass(frozen=True)
class DraftConfig:
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    hidden_act: str
    vocab_size: int
    draft_vocab_size: int
    max_position_embeddings: int
    aux_layer_ids: tuple[int, ...]
    rope: dict[str, Any] = field(default_factory=dict)
    # The layout (params train.draft_layout, under vLLM's names); false in checkpoints made before it existed.
    fc_norm: bool = False
    norm_before_fc: bool = False
    norm_output: bool = False
    norm_before_residual: bool = False
    # train.draft_layer; llama in checkpoints made before it existed. With mla, the MLA shape below (zeros: llama),
    # num_key_value_heads = num_attention_heads and head_dim = qk_rope_head_dim (what rope rotates, as transformers'
    # DeepseekV2Config sets it).
    draft_layer: DraftLayer = "llama"
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0

    @classmethod
    def for_training(
        cls, verifier_config: dict[str, Any], aux_layer_ids: tuple[int, ...], draft_vocab_size: int, train: TrainParams
    ) -> "DraftConfig":
        """The draft the train stage trains for this verifier: shaped as train.intermediate_size, train.attention
        and train.draft_layout say (the one place train, preflight and the plan's memory estimate shape it)."""
        return cls.from_verifier(
            verifier_config,
            aux_layer_ids,
            draft_vocab_size,
            train.intermediate_size,
            train.attention,
            train.draft_layout,
            train.draft_layer,
            train.mla,
        )

    @classmethod
    def from_verifier(
        cls,
        verifier_config: dict[str, Any],
        aux_layer_ids: tuple[int, ...],
        draft_vocab_size: int,
        intermediate_size: int | None = None,
        attention: DraftAttention | None = None,
        layout: DraftLayout | None = None,
        layer: DraftLayer = "llama",
        mla: DraftMLA | None = None,
    ) -> "DraftConfig":
        """The draft for this verifier: its hidden size, vocabulary and MLP width; attention and rope as
        `attention` (train.attention) says, each null derived from the verifier; `layout` (train.draft_layout);
        `layer` (train.draft_layer) and, for mla, its shape as `mla` (train.mla) says."""
        text = text_config(verifier_config)
        attention = attention or DraftAttention()
        layout = layout or DraftLayout()
        try:
            hidden = text["hidden_size"]
            verifier_rope = {key: text[key] for key in ROPE_KEYS if text.get(key) is not None}
            if uses_mla(text):
                derived_heads = max(1, hidden // MLA_HIDDEN_PER_HEAD)
                derived = (derived_heads, derived_heads, MLA_HEAD_DIM)
                if layer == "llama":
                    unscaled = {"rope_type": "default", "rope_theta": MLA_VERIFIER_DRAFT_THETA}
                    verifier_rope = {"rope_parameters": unscaled}
            else:
                verifier_heads = text["num_attention_heads"]
                derived = (
                    verifier_heads,
                    text.get("num_key_value_heads") or verifier_heads,
                    text.get("head_dim") or hidden // verifier_heads,
                )
            heads = attention.num_attention_heads or derived[0]
            kv_heads = attention.num_key_value_heads or (derived[1] if heads == derived[0] else heads)
            if heads % kv_heads:
                raise Eagle3Error(
                    f"train.attention: {kv_heads} KV heads (derived from the verifier) do not divide "
                    f"num_attention_heads {heads}; set train.attention.num_key_value_heads"
                )
            head_dim = attention.head_dim or derived[2]
            if layer == "mla":
                if uses_mla(text) and not attention.num_attention_heads:
                    heads = text["num_attention_heads"]
                latent = _mla_shape(text, mla or DraftMLA(), head_dim)
                kv_heads, head_dim = heads, latent["qk_rope_head_dim"]
            else:
                latent = {}
            return cls(
                hidden_size=hidden,
                num_attention_heads=heads,
                num_key_value_heads=kv_heads,
                head_dim=head_dim,
                intermediate_size=intermediate_size or text["intermediate_size"],
                rms_norm_eps=text.get("rms_norm_eps", 1e-6),
                hidden_act=text.get("hidden_act", "silu"),
                vocab_size=text["vocab_size"],
                draft_vocab_size=draft_vocab_size,
                max_position_embeddings=text["max_position_embeddings"],
                aux_layer_ids=tuple(aux_layer_ids),
                rope=draft_rope(verifier_rope, attention, layer),
                **layout.model_dump(),
                draft_layer=layer,
                **latent,
            )
        except KeyError as exc:
            raise Eagle3Error(f"verifier config.json: missing {exc.args[0]!r}, needed to shape the draft") from None

    @classmethod
    def from_exported(cls, config: dict[str, Any]) -> "DraftConfig":
        """The shape an exported vLLM EAGLE-3 draft's config.json states (eagle3/formats/exported_draft.py)."""
        # Absent: false, as vLLM's loaders of this format read it.
        layout: dict[str, Any] = {key: bool(config.get(key, False)) for key in DraftLayout.model_fields}
        mla: dict[str, Any] = {}
        if config.get("kv_lora_rank"):
            mla = {"draft_layer": "mla", **{key: config.get(key) for key in MLA_KEYS}}
        return cls(
            hidden_size=config["hidden_size"],
            num_attention_heads=config["num_attention_heads"],
            num_key_value_heads=config["num_key_value_heads"],
            head_dim=config["head_dim"],
            intermediate_size=config["intermediate_size"],
            rms_norm_eps=config["rms_norm_eps"],
            hidden_act=config["hidden_act"],
            vocab_size=config["vocab_size"],
            draft_vocab_size=config["draft_vocab_size"],
            max_position_embeddings=config["max_position_embeddings"],
            aux_layer_ids=tuple(config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]),
            rope={key: config[key] for key in ROPE_KEYS if config.get(key) is not None},
            **layout,
            **mla,
        )

    @property
    def layout(self) -> DraftLayout:
        return DraftLayout(**{key: getattr(self, key) for key in DraftLayout.model_fields})

    def llama_config(self):
        """A transformers LlamaConfig with the draft's shape, for rope and the MLP."""
        from transformers import LlamaConfig

        return LlamaConfig(
            hidden_size=self.hidden_size,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            intermediate_size=self.intermediate_size,
            rms_norm_eps=self.rms_norm_eps,
            hidden_act=self.hidden_act,
            vocab_size=self.vocab_size,
            max_position_embeddings=self.max_position_embeddings,
            num_hidden_layers=1,
            **rotary_rope(self.rope, self.draft_layer),
        )

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "aux_layer_ids": list(self.aux_layer_ids)}


def _mla_shape(text: dict[str, Any], mla: DraftMLA, head_dim: int) -> dict[str, Any]:
    """The MLA layer's shape (DraftConfig's MLA_KEYS): each train.mla value, else an MLA verifier's own, else derived
    from the draft's head_dim (DraftMLA's docs)."""
    derived: dict[str, Any] = {
        "kv_lora_rank": 4 * head_dim,
        "qk_nope_head_dim": head_dim,
        "qk_rope_head_dim": max(2, head_dim // 2 // 2 * 2),
        "v_head_dim": head_dim,
    }
    if uses_mla(text):
        derived = {key: text.get(key) for key in derived}
    chosen = {key: getattr(mla, key) or derived[key] for key in derived}
    verifier_q_rank = text.get("q_lora_rank") if uses_mla(text) else None
    chosen["q_lora_rank"] = mla.q_lora_rank or verifier_q_rank or 3 * chosen["kv_lora_rank"]
    missing = [key for key in MLA_KEYS if not chosen[key]]
    if missing:
        raise Eagle3Error(f"train.mla: the verifier's config has no {missing[0]}; set train.mla.{missing[0]}")
    return chosen


class TTTAttention(nn.Module):
    """Attention over 2H inputs whose cache holds step 0's causal keys plus each later step's own key."""

    def __init__(self, config: DraftConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        width = 2 * config.hidden_size
        self.q_proj = nn.Linear(width, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(width, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(width, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=False)
        # Swappable so benchmarks/train_gpu.py can time the quadratic reference in the same model.
        self.attend = ttt_attention

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: tuple[tuple[torch.Tensor, torch.Tensor], ...],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(output, this step's keys, its values); `cache` holds the earlier steps' (a pure function of its inputs,
        so a TTT step can be recomputed in the backward)."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        batch, tokens, _ = x.shape
        q = self.q_proj(x).view(batch, tokens, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, tokens, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, tokens, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        out = self.attend(q, [*cache, (k, v)], 1.0 / math.sqrt(self.head_dim))
        return self.o_proj(out.transpose(1, 2).reshape(batch, tokens, self.heads * self.head_dim)), k, v


class MidLayer(nn.Module):
    def __init__(self, config: DraftConfig):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaMLP

        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = MLAAttention(config) if config.draft_layer == "mla" else TTTAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config.llama_config())
        self.norm_before_residual = config.norm_before_residual

    def forward(self, embeds, hidden, cos, sin, cache, recompute_mlp: bool = False):
        normed = self.hidden_norm(hidden)
        x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)
        attended, k, v = self.self_attn(x, cos, sin, cache)
        residual = attended + (normed if self.norm_before_residual else hidden)
        if recompute_mlp:
            return checkpoint(self.feed_forward, residual, use_reentrant=False) + residual, k, v
        return self.feed_forward(residual) + residual, k, v

    def feed_forward(self, residual: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.post_attention_layernorm(residual))


class Eagle3Draft(nn.Module):
    aux_scale: torch.Tensor  # a buffer (see __init__)

    def __init__(self, config: DraftConfig):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        self.config = config
        hidden = config.hidden_size
        aux = len(config.aux_layer_ids)
        # vLLM's names: input_norm.weight [A*H], fc_norm.{i}.weight [H].
        if config.norm_before_fc:
            self.input_norm = RMSNorm(aux * hidden, config.rms_norm_eps)
        if config.fc_norm:
            self.fc_norm = nn.ModuleList(RMSNorm(hidden, config.rms_norm_eps) for _ in range(aux))
        self.fc = nn.Linear(aux * hidden, hidden, bias=False)
        self.midlayer = MidLayer(config)
        self.norm = RMSNorm(hidden, config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, config.draft_vocab_size, bias=False)
        self.rotary = LlamaRotaryEmbedding(config.llama_config())
        self.register_buffer("aux_scale", torch.ones(len(config.aux_layer_ids) * hidden))

    def init_weights(self, generator: torch.Generator, lm_head: torch.Tensor | None = None) -> None:
        """Deterministic init: N(0, 0.02) linears, unit norms; lm_head from the verifier's rows of the draft vocab
        when given (the draft's final features then start in the verifier's output space)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                with torch.no_grad():
                    module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * 0.02)
        if lm_head is not None:
            with torch.no_grad():
                self.lm_head.weight.copy_(lm_head.to(self.lm_head.weight.dtype))

    def unroll(
        self, input_ids: torch.Tensor, aux: torch.Tensor, embed: nn.Module, steps: int, recompute: str = "off"
    ) -> list[torch.Tensor]:
        """Training-time test. input_ids [B, T] (the verifier's sequence), aux [B, T, A*H].
        Returns per step i the pre-norm features [B, T, H] where position t predicts token t+2+i (ttt_alignment)
        (`logits` turns them into draft-vocab logits; the trainer does so only where the loss counts).
        `recompute` (train.activation_checkpointing): "full" keeps only each step's inputs and outputs for the
        backward and runs the whole step again there; "mlp" recomputes only each step's MLP, the largest part
        of what a step keeps (several GB per step at 16K tokens at Kimi-K2.5's shape); "off" keeps everything."""
        if recompute not in RECOMPUTE:
            raise ValueError(f"recompute {recompute!r}: expected one of {', '.join(RECOMPUTE)}")
        batch, tokens = input_ids.shape
        hidden = self.fc(self.fc_input(aux))
        positions = torch.arange(tokens, device=input_ids.device).expand(batch, tokens)
        training = torch.is_grad_enabled()
        recompute_mlp = training and recompute == "mlp"

        def step(ahead, hidden, cos, sin, cache):
            # The embedding lookup inside the step, so a recomputed step keeps token ids rather than embeddings.
            return self.midlayer(embed(ahead).to(hidden.dtype), hidden, cos, sin, cache, recompute_mlp)

        if training and recompute == "full":
            step = functools.partial(checkpoint, step, use_reentrant=False)
        cache: list[tuple[torch.Tensor, torch.Tensor]] = []
        features = []
        for i in range(steps):
            cos, sin = self.rotary(hidden, positions + i)
            output, k, v = step(shift_left(input_ids, input_offset(i)), hidden, cos, sin, tuple(cache))
            cache.append((k, v))
            features.append(output)
            hidden = self.norm(output) if self.config.norm_output else output
        return features

    def fc_input(self, aux: torch.Tensor) -> torch.Tensor:
        """fc's input from the aux states [.., A*H] as the layout says: aux_scale's per-channel division (ones where
        the layout normalises: see `aux_scale`), one norm over all of them, one per layer."""
        x = aux.to(self.aux_scale.dtype) / self.aux_scale  # shards hold bf16; the scale is fp32
        if self.config.norm_before_fc:
            x = self.input_norm(x)
        if self.config.fc_norm:
            parts = x.chunk(len(self.fc_norm), -1)
            x = torch.cat([norm(part) for norm, part in zip(self.fc_norm, parts, strict=True)], -1)
        return x

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(features))

    def export_state(self, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """The vLLM tensors: aux_scale folded into fc.weight, training-only buffers dropped."""
        state = {name: tensor.detach().float() for name, tensor in self.named_parameters()}
        if self.config.layout.normalises_aux:
            if not bool(self.aux_scale.eq(1).all()):
                raise ValueError("aux_scale must stay ones in a layout with an aux norm: it cannot be folded into fc")
        else:
            state["fc.weight"] = state["fc.weight"] / self.aux_scale.float()[None, :]
        return {name: tensor.to(dtype).contiguous() for name, tensor in state.items()}
