"""Stage evaluate: the exported draft measured inside vLLM against vLLM's n-gram method, on held-out prompts."""

import csv
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import copy_project, draft_params, eagle3
from eagle3.errors import Eagle3Error
from eagle3.evaluate import heldout_prompts
from eagle3.synthetic import iter_records


@pytest.fixture(scope="module")
def evaluated(trained, tmp_path_factory):
    root = copy_project(trained, tmp_path_factory.mktemp("evaluated"), draft_params())
    eagle3(root, "evaluate")
    return root


@pytest.mark.slow
def test_eval_metrics_follow_vllm_counters_and_the_draft_beats_ngram(evaluated):
    metrics = json.loads((evaluated / "metrics/eval.json").read_text())
    runs = {(r["method"], r["k"], r["temperature"]): r for r in metrics["runs"]}
    assert set(runs) == {(m, k, t) for m, k in (("none", None), ("eagle3", 3), ("ngram", 3)) for t in (0.0, 0.7)}
    for run in metrics["runs"]:
        assert run["prompts"] == 8 and run["output_tokens"] > 0
        steps = run["output_tokens"] - run["accepted_tokens"]
        assert run["verifier_steps"] == steps and run["tokens_per_step"] == round(run["output_tokens"] / steps, 4)
    assert runs[("none", None, 0.0)]["tokens_per_step"] == 1.0 and runs[("none", None, 0.0)]["accepted_tokens"] == 0
    draft = runs[("eagle3", 3, 0.0)]
    assert draft["lossless_identical"] == 8, "greedy output with the draft must equal the verifier's own"
    assert len(draft["acceptance_by_position"]) == 3 and draft["num_drafts"] > 0
    assert draft["acceptance_by_position"][0] >= draft["acceptance_by_position"][2]
    assert draft["mean_acceptance_length"] == round(1 + draft["accepted_tokens"] / draft["num_drafts"], 4)
    # 32 short training answers generalise only a little to unseen prompts, but the draft is accepted there.
    assert draft["accepted_tokens"] > 0 and draft["tokens_per_step"] > 1.0
    headline = metrics["headline"]
    assert headline["tokens_per_step_k3_greedy"] == draft["tokens_per_step"]
    assert headline["ngram_tokens_per_step_k3_greedy"] == runs[("ngram", 3, 0.0)]["tokens_per_step"]
    offline = metrics["offline_estimate"]
    assert offline["positions"] > 0 and 1.0 <= offline["tokens_per_step"] <= 4.0
    assert offline["gap"] == round(offline["tokens_per_step"] - draft["tokens_per_step"], 4)
    with open(evaluated / "metrics/eval/tokens_per_step.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert rows == [{"k": "3", "eagle3_greedy": str(draft["tokens_per_step"]),
                     "ngram_greedy": str(runs[("ngram", 3, 0.0)]["tokens_per_step"]),
                     "eagle3_sampled": str(runs[("eagle3", 3, 0.7)]["tokens_per_step"]),
                     "ngram_sampled": str(runs[("ngram", 3, 0.7)]["tokens_per_step"])}]
    assert (evaluated / "reports/eval.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_no_evaluated_prompt_was_trained_on(evaluated):
    evaluated_hashes = set(json.loads((evaluated / "metrics/eval.json").read_text())["prompts"]["prompt_hashes"])
    trained_on = {record["prompt_hash"] for record in iter_records(evaluated, "train")}
    assert len(evaluated_hashes) == 8 and trained_on and not evaluated_hashes & trained_on


def _prepared(root, train_hashes, heldout_hashes):
    out = root / "data/prepared"
    out.mkdir(parents=True)
    for split, hashes in (("train", train_hashes), ("heldout", heldout_hashes)):
        rows = [{"id": h[:16], "prompt_hash": h, "messages": [{"role": "user", "content": f"question {h}"},
                                                              {"role": "assistant", "content": "an old answer"}]}
                for h in hashes]
        pq.write_table(pa.Table.from_pylist(rows), out / f"{split}.parquet")


def test_a_heldout_prompt_seen_in_training_stops_the_stage(tmp_path):
    _prepared(tmp_path, ["a" * 64, "b" * 64], ["c" * 64, "b" * 64])
    with pytest.raises(Eagle3Error, match="1 held-out prompts are also training prompts"):
        heldout_prompts(tmp_path, None)


def test_heldout_prompts_stop_before_the_first_answer(tmp_path):
    _prepared(tmp_path, ["a" * 64], ["c" * 64, "d" * 64])
    hashes, prompts = heldout_prompts(tmp_path, 1)
    assert hashes == ["c" * 64] and prompts == [[{"role": "user", "content": f"question {'c' * 64}"}]]
