"""The capture engine's KV cache as vLLM's own KV-cache grouping lays it out (vllm/v1/core/kv_cache_utils.py), for
the layer specs vLLM makes of gpt-oss-20b (its recipe's config: sliding-window and full attention alternating) and
the extract_hidden_states layer that holds the captured states: what one longest sequence takes of the pool with
the settings the capture starts its engine with (eagle3/engines/hidden_states/vllm_capture.py CAPTURE_ENGINE)."""

import json
from types import SimpleNamespace

import torch
from vllm.config.cache import CacheConfig
from vllm.v1.core import kv_cache_utils
from vllm.v1.kv_cache_interface import FullAttentionSpec, HiddenStateCacheSpec, SlidingWindowSpec

from eagle3.engines.hidden_states.vllm_capture import CAPTURE_ENGINE
from eagle3.init.files import RECIPES_DIR

KiB = 1024
BLOCK = 16  # vLLM's default block size on CUDA
CAPTURED = 4  # vLLM's default aux layers (2, 12, 21) and the final layer


def _specs(config: dict) -> dict:
    shapes = {"num_kv_heads": config["num_key_value_heads"], "head_size": config["head_dim"], "dtype": torch.bfloat16}
    specs = {
        f"model.layers.{number}.self_attn.attn": (
            SlidingWindowSpec(block_size=BLOCK, sliding_window=config["sliding_window"], **shapes)
            if kind == "sliding_attention"
            else FullAttentionSpec(block_size=BLOCK, **shapes)
        )
        for number, kind in enumerate(config["layer_types"])
    }
    # vllm/model_executor/models/extract_hidden_states.py: one cache-only layer, a "head" per captured layer.
    specs["cache_only_layers.24"] = HiddenStateCacheSpec(
        block_size=BLOCK, num_kv_heads=CAPTURED, head_size=config["hidden_size"], dtype=torch.bfloat16
    )
    return specs


def _pool_bytes_per_token(config: dict, hybrid_manager: bool, sequence: int) -> float:
    """What one `sequence`-token request takes of the KV pool, per token, as vLLM's scheduler reserves it."""
    cache = CacheConfig(block_size=BLOCK)
    cache.kv_cache_layout = "LBNHC"  # CUDA's
    vllm_config = SimpleNamespace(
        cache_config=cache,
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=not hybrid_manager),
        attention_config=SimpleNamespace(hisparse_config=None),
        speculative_config=SimpleNamespace(
            use_eagle=lambda: False, use_eagle_block_drop=lambda: False, method="extract_hidden_states"
        ),
        model_config=SimpleNamespace(max_model_len=sequence, hf_config=SimpleNamespace(model_type="gpt_oss")),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1, tensor_parallel_size=1),
        max_in_flight_tokens=sequence,
    )
    groups = kv_cache_utils.get_kv_cache_groups(vllm_config, _specs(config))
    return kv_cache_utils._max_memory_usage_bytes_from_groups(vllm_config, groups) / sequence


def test_gpt_oss_20b_s_captured_states_take_what_they_hold_of_the_kv_pool():
    config = json.loads((RECIPES_DIR / "gpt-oss-20b" / "config.json").read_text())
    sequence = 8193  # the recipe's extract.max_seq_len + 1
    # The hybrid manager (vLLM's default on CUDA): the captured layer's 22.5 KiB a token in one-token blocks of the
    # pool's 384 KiB.
    assert round(_pool_bytes_per_token(config, True, sequence) / KiB) == 432
    # As the capture starts its engine: 24 layers x 2 x 8 x 64 x 2 bytes + 4 x 2,880 x 2 = 70.5 KiB a token (and
    # the last block's rounding: 8,193 tokens take 513 blocks of 16).
    assert CAPTURE_ENGINE["disable_hybrid_kv_cache_manager"] is True
    took = _pool_bytes_per_token(config, not CAPTURE_ENGINE["disable_hybrid_kv_cache_manager"], sequence)
    assert took * sequence == 513 * BLOCK * (24 * 2 * 8 * 64 * 2 + CAPTURED * 2880 * 2)
