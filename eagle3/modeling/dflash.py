"""The DFlash block draft: decoder layers that propose a whole block of tokens in one forward, conditioned on the
verifier's aux hidden states, as vLLM 0.32 serves it (`method: dflash`: model_executor/models/qwen3_dflash.py, the
V1 proposer v1/spec_decode/dflash.py, the V2 speculator v1/worker/gpu/spec_decode/dflash/).

Parameter names are vLLM's DFlashDraftModel checkpoint names (no `model.` prefix), so export is a rename-free save:

    fc.weight [H, A*H]                        the captured aux states (ascending layer order) -> H
    hidden_norm.weight [H]                    applied to fc's output: the context
    layers.{i}.input_layernorm.weight [H]     and post_attention_layernorm.weight [H]
    layers.{i}.self_attn.{q,k,v,o}_proj       Qwen3 attention (GQA), no bias
    layers.{i}.self_attn.{q,k}_norm [head_dim] per-head RMSNorm before rope
    layers.{i}.mlp.{gate,up,down}_proj        SwiGLU
    norm.weight [H], lm_head.weight [draft_vocab, H]

The token embedding is the verifier's (vLLM shares it when the checkpoint has none), the mask token's row included.

One block at anchor p, exactly as vLLM computes it: the context c = hidden_norm(fc(aux)) at every position < p (no
norm before fc); each layer l keeps K_l = rope(k_norm_l(k_proj_l(c)), t), V_l = v_proj_l(c) of the context (no
input_layernorm on it: vLLM writes these into the draft's KV cache before the block runs). The block is
embed([x_p, m, ..., m]) at positions p..p+B-1 (x_p the token the verifier has just produced at p, m the mask token),
through pre-norm layers whose attention sees the context keys < p and every key of its own block (bidirectional);
lm_head(norm(h)) at block slot i >= 1 proposes the token at p+i.

Training runs many anchors of a sequence at once (`forward`): their blocks are queries side by side over one set of
context keys, each masked to the context before its own anchor and to its own block (`block_attention`), so memory
is linear in the sequence (anchors x block x context), never quadratic.
"""

from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from eagle3.errors import Eagle3Error
from eagle3.formats.hf_config import text_config, uses_mla
from eagle3.modeling.norms import RMSNorm
from eagle3.modeling.rope import MLA_VERIFIER_DRAFT_THETA, ROPE_KEYS
from eagle3.params.train import TrainParams


@dataclass(frozen=True)
class DFlashConfig:
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    num_hidden_layers: int
    rms_norm_eps: float
    vocab_size: int
    draft_vocab_size: int
    max_position_embeddings: int
    # vLLM's ids of the captured aux layers (id k = HF hidden_states[k]); DFlash's own target_layer_ids are k - 1.
    aux_layer_ids: tuple[int, ...]
    block_size: int
    mask_token_id: int
    rope: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def for_training(
        cls,
        verifier_config: dict[str, Any],
        aux_layer_ids: tuple[int, ...],
        draft_vocab_size: int,
        train: TrainParams,
        mask_token_id: int,
    ) -> "DFlashConfig":
        """The block draft the train stage trains for this verifier (train.dflash, train.intermediate_size), with
        the mask token already chosen (train.dflash.mask_token_id, or eagle3/chat/mask_token.py's)."""
        return cls.from_verifier(
            verifier_config,
            aux_layer_ids,
            draft_vocab_size,
            layers=train.dflash.layers,
            block_size=train.dflash.block_size,
            mask_token_id=mask_token_id,
            intermediate_size=train.intermediate_size,
        )

    @classmethod
    def from_verifier(
        cls,
        verifier_config: dict[str, Any],
        aux_layer_ids: tuple[int, ...],
        draft_vocab_size: int,
        *,
        layers: int,
        block_size: int,
        mask_token_id: int,
        intermediate_size: int | None = None,
    ) -> "DFlashConfig":
        """The block draft for this verifier: its hidden size, heads, head size, MLP and rope (an MLA verifier's
        draft gets heads of 128 at its hidden size and an unscaled rope, as its EAGLE-3 draft does)."""
        text = text_config(verifier_config)
        try:
            hidden = text["hidden_size"]
            if uses_mla(text):
                heads, kv_heads, head_dim = max(1, hidden // 128), max(1, hidden // 128), 128
                unscaled = {"rope_type": "default", "rope_theta": MLA_VERIFIER_DRAFT_THETA}
                rope: dict[str, Any] = {"rope_parameters": unscaled}
            else:
                heads = text["num_attention_heads"]
                kv_heads = text.get("num_key_value_heads") or heads
                head_dim = text.get("head_dim") or hidden // heads
                rope = {key: text[key] for key in ROPE_KEYS if text.get(key) is not None}
            if not 0 <= mask_token_id < text["vocab_size"]:
                raise Eagle3Error(
                    f"train.dflash.mask_token_id: {mask_token_id} is not a token of the verifier's vocabulary "
                    f"(0..{text['vocab_size'] - 1}); set another, or null to take an unused special token"
                )
            return cls(
                hidden_size=hidden,
                num_attention_heads=heads,
                num_key_value_heads=kv_heads,
                head_dim=head_dim,
                intermediate_size=intermediate_size or text["intermediate_size"],
                num_hidden_layers=layers,
                rms_norm_eps=text.get("rms_norm_eps") or 1e-6,
                vocab_size=text["vocab_size"],
                draft_vocab_size=draft_vocab_size,
                max_position_embeddings=text["max_position_embeddings"],
                aux_layer_ids=tuple(sorted(aux_layer_ids)),
                block_size=block_size,
                mask_token_id=mask_token_id,
                rope=rope,
            )
        except KeyError as exc:
            raise Eagle3Error(f"verifier config.json: missing {exc.args[0]!r}, needed to shape the draft") from None

    def rotary_config(self):
        """A transformers Qwen3Config with the draft's shape, for its rope (neox-style, as vLLM's get_rope)."""
        from transformers import Qwen3Config

        rope = dict(self.rope) or {"rope_theta": MLA_VERIFIER_DRAFT_THETA}
        return Qwen3Config(
            hidden_size=self.hidden_size,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            intermediate_size=self.intermediate_size,
            rms_norm_eps=self.rms_norm_eps,
            vocab_size=self.vocab_size,
            max_position_embeddings=self.max_position_embeddings,
            num_hidden_layers=self.num_hidden_layers,
            **rope,
        )

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "aux_layer_ids": list(self.aux_layer_ids)}


def block_mask(anchors: torch.Tensor, context: int, block_size: int) -> torch.Tensor:
    """[B, 1, N*S, context + N*S] bool: which keys each block query may see. Query (n, i) sees context positions
    before anchor n and the S keys of its own block (bidirectional)."""
    batch, count = anchors.shape
    positions = torch.arange(context, device=anchors.device)
    sees_context = positions[None, None, :] < anchors[:, :, None]  # [B, N, context]
    own = torch.eye(count, dtype=torch.bool, device=anchors.device)  # [N, N]
    sees_block = (
        own[:, None, :, None]
        .expand(count, block_size, count, block_size)
        .reshape(count, block_size, count * block_size)
    )
    rows = torch.cat(
        [
            sees_context[:, :, None, :].expand(batch, count, block_size, context),
            sees_block[None].expand(batch, count, block_size, count * block_size),
        ],
        dim=-1,
    )
    return rows.reshape(batch, 1, count * block_size, context + count * block_size)


def block_attention(
    q: torch.Tensor,
    context_kv: tuple[torch.Tensor, torch.Tensor],
    block_kv: tuple[torch.Tensor, torch.Tensor],
    anchors: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Every anchor's block attending to the context before its anchor and to itself: q [B, heads, N*S, d] (blocks
    side by side, S queries each), context keys/values [B, kv_heads, T, d], block keys/values [B, kv_heads, N*S,
    d], anchors [B, N]. One fused attention (flash on CPU and CUDA, no score matrix kept), its mask the only
    quadratic-looking term, at one byte per (query, key)."""
    k_context, v_context = context_kv
    k_block, v_block = block_kv
    count = anchors.shape[1]
    mask = block_mask(anchors, k_context.shape[2], q.shape[2] // count)
    keys, values = torch.cat([k_context, k_block], dim=2), torch.cat([v_context, v_block], dim=2)
    return F.scaled_dot_product_attention(
        q, keys, values, attn_mask=mask, scale=scale, enable_gqa=q.shape[1] != keys.shape[1]
    )


class DFlashAttention(nn.Module):
    def __init__(self, config: DFlashConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        hidden = config.hidden_size
        self.q_proj = nn.Linear(hidden, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden, bias=False)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def _heads(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        return x.view(*x.shape[:2], heads, self.head_dim).transpose(1, 2)

    def keys_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (per-head norm, rope) and values [B, kv_heads, T, d] of x [B, T, H]."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        k = self.k_norm(self._heads(self.k_proj(x), self.kv_heads))
        v = self._heads(self.v_proj(x), self.kv_heads)
        k, _ = apply_rotary_pos_emb(k, k, cos, sin)
        return k, v

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        context_kv: tuple[torch.Tensor, torch.Tensor],
        anchors: torch.Tensor,
    ) -> torch.Tensor:
        """x [B, N*S, H]: the blocks side by side; context_kv this layer's keys/values of the context."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        q = self.q_norm(self._heads(self.q_proj(x), self.heads))
        q, _ = apply_rotary_pos_emb(q, q, cos, sin)
        block_kv = self.keys_values(x, cos, sin)
        out = block_attention(q, context_kv, block_kv, anchors, self.head_dim**-0.5)
        return self.o_proj(out.transpose(1, 2).reshape(*x.shape[:2], self.heads * self.head_dim))


class DFlashLayer(nn.Module):
    def __init__(self, config: DFlashConfig):
        super().__init__()
        from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP

        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DFlashAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = Qwen3MLP(config.rotary_config())

    def forward(self, h, cos, sin, context_kv, anchors):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, context_kv, anchors)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDraft(nn.Module):
    def __init__(self, config: DFlashConfig):
        super().__init__()
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

        self.config = config
        hidden = config.hidden_size
        self.fc = nn.Linear(len(config.aux_layer_ids) * hidden, hidden, bias=False)
        self.hidden_norm = RMSNorm(hidden, config.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(hidden, config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, config.draft_vocab_size, bias=False)
        self.rotary = Qwen3RotaryEmbedding(config.rotary_config())

    def init_weights(self, generator: torch.Generator, lm_head: torch.Tensor | None = None) -> None:
        """Deterministic init: N(0, 0.02) linears, unit norms; lm_head from the verifier's rows of the draft vocab
        when given."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                with torch.no_grad():
                    module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * 0.02)
        if lm_head is not None:
            with torch.no_grad():
                self.lm_head.weight.copy_(lm_head.to(self.lm_head.weight.dtype))

    def context(self, aux: torch.Tensor) -> torch.Tensor:
        """c = hidden_norm(fc(aux)) [B, T, H]: what every layer projects its context keys and values from."""
        return self.hidden_norm(self.fc(aux.to(self.fc.weight.dtype)))

    def forward(self, input_ids: torch.Tensor, aux: torch.Tensor, anchors: torch.Tensor, embed: nn.Module):
        """input_ids [B, T] (the verifier's sequence), aux [B, T, A*H], anchors [B, N] (positions p, 0 < p < T).
        Returns the pre-norm features [B, N, S, H] of each anchor's block: slot i predicts the token at p+i
        (`logits` turns them into draft-vocab logits)."""
        batch, tokens = input_ids.shape
        count, size = anchors.shape[1], self.config.block_size
        context = self.context(aux)
        cos_c, sin_c = self.rotary(context, torch.arange(tokens, device=input_ids.device).expand(batch, tokens))
        positions = (anchors[:, :, None] + torch.arange(size, device=anchors.device)).reshape(batch, count * size)
        mask = self.config.mask_token_id
        ids = torch.full((batch, count, size), mask, dtype=input_ids.dtype, device=input_ids.device)
        ids[:, :, 0] = input_ids.gather(1, anchors)
        h = embed(ids.reshape(batch, count * size)).to(context.dtype)
        cos, sin = self.rotary(h, positions)
        for layer in self.layers:
            assert isinstance(layer, DFlashLayer)
            context_kv = layer.self_attn.keys_values(context, cos_c, sin_c)
            h = layer(h, cos, sin, context_kv, anchors)
        return h.reshape(batch, count, size, h.shape[-1])  # named: an empty batch has no rows to infer it from

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(features))

    def export_state(self, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """vLLM's tensors, in `dtype`."""
        return {name: tensor.detach().to(dtype).contiguous() for name, tensor in self.named_parameters()}
