"""The draft's rope: the config keys it carries (the verifier's own, or as train.attention sets them) and, for the
MLA layer, the DeepSeek YaRN that vLLM's DeepseekV2MLAAttention computes from them.

vLLM's MLA attention turns every scaled rope into DeepSeek's YaRN (get_rope's deepseek_yarn): the YaRN frequencies
from factor, original_max_position_embeddings and beta_fast/beta_slow; cos and sin scaled by
mscale(factor, mscale) / mscale(factor, mscale_all_dim); and the softmax scale multiplied by
mscale(factor, mscale_all_dim)^2, where mscale(f, m) = 0.1 m ln f + 1 (1 for f <= 1). Training computes the
frequencies with transformers' yarn rope, which matches vLLM's but for two settings vLLM does not read: `truncate`
(vLLM always truncates) and `attention_factor` (vLLM's cos/sin scale comes from the two mscales alone; one equal to
1.0 would make it another rope). The MLA draft therefore carries only the keys vLLM reads, and its training rotary
gets the cos/sin scale computed as vLLM does (`rotary_rope`).
"""

import math
from typing import Any

from eagle3.errors import Eagle3Error
from eagle3.params.train import DraftAttention, DraftLayer

# Config keys copied verbatim from the verifier so rope (incl. scaling such as YaRN) is computed identically.
ROPE_KEYS = ("rope_theta", "rope_scaling", "rope_parameters")
# The Llama-style draft of an MLA verifier (train.attention's docs): unscaled, at this theta; also the theta of a
# draft whose verifier names none.
MLA_VERIFIER_DRAFT_THETA = 1e6
# What vLLM's DeepSeek YaRN reads besides rope_theta (get_rope's deepseek_yarn branch); the first two are required.
DEEPSEEK_YARN_KEYS = (
    "factor",
    "original_max_position_embeddings",
    "beta_fast",
    "beta_slow",
    "mscale",
    "mscale_all_dim",
)


def draft_rope(verifier_rope: dict[str, Any], attention: DraftAttention, layer: DraftLayer = "llama") -> dict[str, Any]:
    """The draft's rope config keys. The Llama-style layer: the verifier's own (verbatim) unless train.attention sets
    theta or scaling, then transformers' `rope_parameters` built from the verifier's values and the overrides. The
    MLA layer: always `rope_parameters`, unscaled or DeepSeek's YaRN with the keys vLLM reads."""
    if layer == "mla":
        return _mla_rope(draft_rope(verifier_rope, attention))
    if attention.rope_theta is None and attention.rope_scaling is None:
        return verifier_rope
    base = dict(verifier_rope.get("rope_parameters") or verifier_rope.get("rope_scaling") or {})
    theta = (
        attention.rope_theta or base.get("rope_theta") or verifier_rope.get("rope_theta") or MLA_VERIFIER_DRAFT_THETA
    )
    if attention.rope_scaling == "none":
        scaling: dict[str, Any] = {}
    elif isinstance(attention.rope_scaling, dict):
        scaling = dict(attention.rope_scaling)
    else:
        scaling = {key: value for key, value in base.items() if key != "rope_theta"}
    rope_type = scaling.pop("rope_type", None) or scaling.pop("type", None) or "default"
    scaling.pop("type", None)
    return {"rope_parameters": {"rope_type": rope_type, **scaling, "rope_theta": theta}}


def _mla_rope(rope: dict[str, Any]) -> dict[str, Any]:
    parameters = rope.get("rope_parameters") or rope.get("rope_scaling") or {}
    theta = parameters.get("rope_theta") or rope.get("rope_theta") or MLA_VERIFIER_DRAFT_THETA
    rope_type = parameters.get("rope_type") or parameters.get("type") or "default"
    if any(isinstance(value, dict) for value in parameters.values()):
        raise Eagle3Error(
            "train.draft_layer mla: the verifier's rope is set per layer type, and the draft has one layer; set "
            "train.attention.rope_theta, and rope_scaling (none or a yarn mapping)"
        )
    if rope_type == "default":
        return {"rope_parameters": {"rope_type": "default", "rope_theta": theta}}
    if rope_type != "yarn":
        raise Eagle3Error(
            f"train.draft_layer mla: the draft's rope would be {rope_type}-scaled, which vLLM's MLA draft computes as "
            "DeepSeek's YaRN and training does not; set train.attention.rope_scaling: none, or a yarn mapping"
        )
    missing = [key for key in DEEPSEEK_YARN_KEYS[:2] if not parameters.get(key)]
    if missing:
        raise Eagle3Error(
            f"train.draft_layer mla: the draft's yarn rope has no {missing[0]}, which vLLM's MLA draft needs; set "
            f"train.attention.rope_scaling to a yarn mapping with {missing[0]}, or none"
        )
    kept = {key: parameters[key] for key in DEEPSEEK_YARN_KEYS if parameters.get(key) is not None}
    return {"rope_parameters": {"rope_type": "yarn", **kept, "rope_theta": theta}}


def _yarn_mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn(rope: dict[str, Any]) -> dict[str, Any] | None:
    parameters = rope.get("rope_parameters") or {}
    return parameters if parameters.get("rope_type") == "yarn" else None


def rotary_rope(rope: dict[str, Any], layer: DraftLayer) -> dict[str, Any]:
    """The rope keys transformers' rotary embedding computes the draft's training cos/sin from: the draft's own, and
    for a YaRN MLA layer the cos/sin scale vLLM's DeepSeek YaRN applies."""
    yarn = _yarn(rope) if layer == "mla" else None
    if yarn is None:
        return rope
    scale = _yarn_mscale(yarn["factor"], yarn.get("mscale", 1.0)) / _yarn_mscale(
        yarn["factor"], yarn.get("mscale_all_dim", 0.0)
    )
    return {"rope_parameters": {**yarn, "attention_factor": scale}}


def mla_softmax_scale(rope: dict[str, Any], qk_dim: int) -> float:
    """The MLA layer's attention scale: 1/sqrt(nope + rope), times mscale(factor, mscale_all_dim)^2 under YaRN."""
    yarn = _yarn(rope)
    mscale = _yarn_mscale(yarn["factor"], yarn.get("mscale_all_dim", 0.0)) if yarn else 1.0
    return qk_dim**-0.5 * mscale * mscale
