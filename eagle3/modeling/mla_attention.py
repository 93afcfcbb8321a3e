"""The MLA draft layer's attention (train.draft_layer mla): multi-head latent attention as vLLM's
deepseek_eagle3.py runs it (DeepseekV2MLAAttention over the 2H input of embedding and hidden state).

Parameter names are vLLM's (its loader stacks q_a_proj and kv_a_proj_with_mqa into fused_qkv_a_proj):

    q_a_proj [q_lora_rank, 2H], q_a_layernorm [q_lora_rank], q_b_proj [heads * (nope + rope), q_lora_rank]
    kv_a_proj_with_mqa [kv_lora_rank + rope, 2H]   the compressed key/value and the one shared rope key
    kv_a_layernorm [kv_lora_rank], kv_b_proj [heads * (nope + v), kv_lora_rank], o_proj [H, heads * v]

Per head, the query is [q_nope, rope(q_rope)] and the key [k_nope, rope(k_rope)] with k_nope and the value expanded
from the normed compressed vector, so the scores are q_nope . k_nope + rope(q_rope) . rope(k_rope), scaled by
1 / sqrt(nope + rope) (times YaRN's mscale^2 under YaRN: eagle3/modeling/rope.py). vLLM decodes in the absorbed form
(q_nope through kv_b_proj's key half, scores against the cached compressed vectors, the value half applied after):
the same products in another order; training computes the expanded form, which the linear-memory TTT attention
(eagle3/modeling/attention.py) takes as it is. Rope rotates interleaved pairs (vLLM's is_neox_style=False); q and k
are both permuted to halves first, which leaves every product unchanged.
"""

import torch
from torch import nn

from eagle3.modeling.attention import ttt_attention
from eagle3.modeling.norms import RMSNorm
from eagle3.modeling.rope import mla_softmax_scale


def _interleaved_to_halves(x: torch.Tensor) -> torch.Tensor:
    """[..., d] with rope pairs at (2i, 2i+1) -> [..., d] with pair i at (i, i + d/2), rotate_half's layout."""
    return x.unflatten(-1, (-1, 2)).transpose(-1, -2).flatten(-2)


class MLAAttention(nn.Module):
    """Same interface as the Llama-style layer's TTTAttention: (output, this step's keys, its values)."""

    def __init__(self, config):
        super().__init__()
        self.heads = config.num_attention_heads
        self.nope, self.rope, self.v_dim = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
        self.kv_lora_rank = config.kv_lora_rank
        qk_dim = self.nope + self.rope
        width = 2 * config.hidden_size
        self.q_a_proj = nn.Linear(width, config.q_lora_rank, bias=False)
        self.q_a_layernorm = RMSNorm(config.q_lora_rank, config.rms_norm_eps)
        self.q_b_proj = nn.Linear(config.q_lora_rank, self.heads * qk_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(width, self.kv_lora_rank + self.rope, bias=False)
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, config.rms_norm_eps)
        self.kv_b_proj = nn.Linear(self.kv_lora_rank, self.heads * (self.nope + self.v_dim), bias=False)
        self.o_proj = nn.Linear(self.heads * self.v_dim, config.hidden_size, bias=False)
        self.scale = mla_softmax_scale(config.rope, qk_dim)
        # The attention kernels take one head size for q, k and v: the narrower side is zero-padded (zeros add
        # nothing to a score, and a zero value column is dropped after).
        self.width = max(qk_dim, self.v_dim)
        self.attend = ttt_attention

    def query(self, x: torch.Tensor) -> torch.Tensor:
        return self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: tuple[tuple[torch.Tensor, torch.Tensor], ...],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        batch, tokens, _ = x.shape
        q = self.query(x).view(batch, tokens, self.heads, self.nope + self.rope).transpose(1, 2)
        q_nope, q_rope = q.split([self.nope, self.rope], dim=-1)
        compressed, k_rope = self.kv_a_proj_with_mqa(x).split([self.kv_lora_rank, self.rope], dim=-1)
        expanded = self.kv_b_proj(self.kv_a_layernorm(compressed))
        k_nope, v = (
            expanded.view(batch, tokens, self.heads, self.nope + self.v_dim)
            .transpose(1, 2)
            .split([self.nope, self.v_dim], dim=-1)
        )
        q_rope, k_rope = apply_rotary_pos_emb(
            _interleaved_to_halves(q_rope), _interleaved_to_halves(k_rope.unsqueeze(1)), cos, sin
        )
        k = torch.cat([k_nope, k_rope.expand(batch, self.heads, tokens, self.rope)], dim=-1)
        q = torch.cat([q_nope, q_rope], dim=-1)
        q, k, v = (_pad(t, self.width) for t in (q, k, v))
        out = self.attend(q, [*cache, (k, v)], self.scale).narrow(-1, 0, self.v_dim)
        return self.o_proj(out.transpose(1, 2).reshape(batch, tokens, self.heads * self.v_dim)), k, v


def _pad(tensor: torch.Tensor, width: int) -> torch.Tensor:
    extra = width - tensor.shape[-1]
    return tensor if not extra else torch.cat([tensor, tensor.new_zeros(*tensor.shape[:-1], extra)], dim=-1)
