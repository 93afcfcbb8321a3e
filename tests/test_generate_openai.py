"""The openai backend: faults, skips and reasoning against scripted servers, and a real `vllm serve`
restarted mid-run."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagle3.chat.reasoning import render
from eagle3.precision import resolve

from conftest import eagle3, write_params
from fake_openai import FakeServer, completion
from servers import free_port, vllm_serve, wait_healthy
from test_generate import _params, output_files, prepared, project, records

pytestmark = pytest.mark.slow


def _openai(url: str, **settings) -> dict:
    return {
        "backend": "openai",
        "openai": {
            "base_urls": [url],
            "model": "verifier",
            "max_retries": 2,
            "backoff_s": 0.05,
            "max_backoff_s": 0.1,
            "concurrency": 4,
            **settings,
        },
    }


def _last_line(result) -> str:
    return result.stderr.strip().splitlines()[-1]


def test_unreachable_server_is_one_clear_error(verifier_project, tmp_path):
    url = f"http://127.0.0.1:{free_port()}/v1"
    root = project(tmp_path, verifier_project, _params(_openai(url)))
    result = eagle3(root, "generate", check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert re.fullmatch(
        rf"eagle3 generate: error: generate: {re.escape(url)} failed 3 attempts in a row \(last: ConnectError.*\); "
        r"0/6 parts \(0/41 samples\) are finished and kept, rerun to continue",
        _last_line(result),
    ), _last_line(result)


@pytest.mark.parametrize(
    "reply, delay, settings, problem",
    [
        (lambda body: (500, {"error": "boom"}), 0.0, {}, "HTTP 500"),
        (lambda body: (429, {"error": "slow down"}), 0.0, {}, "HTTP 429"),
        (lambda body: completion("late"), 1.5, {"timeout_s": 0.3}, "no answer within generate.openai.timeout_s"),
    ],
)
def test_server_faults_retry_then_stop_naming_the_url(verifier_project, tmp_path, reply, delay, settings, problem):
    with FakeServer(reply, delay_s=delay) as server:
        root = project(tmp_path, verifier_project, _params(_openai(server.url, concurrency=1, **settings)))
        result = eagle3(root, "generate", check=False)
        assert len(server.requests) >= 3  # the first request and its two retries
    assert result.returncode == 2
    assert f"generate: {server.url} failed 3 attempts in a row (last: {problem}" in _last_line(result)


def test_rejected_request_fails_at_once(verifier_project, tmp_path):
    with FakeServer(lambda body: (404, {"error": f"model {body['model']} does not exist"})) as server:
        root = project(tmp_path, verifier_project, _params(_openai(server.url, concurrency=1)))
        result = eagle3(root, "generate", check=False)
        assert len(server.requests) == 1
    assert 'rejected the request: HTTP 404: {"error": "model verifier does not exist"}' in _last_line(result)


def test_failure_midway_keeps_finished_parts_and_rerun_completes(verifier_project, tmp_path):
    answered = []

    def flaky(body):
        if len(answered) >= 20:
            return 503, {"error": "overloaded"}
        answered.append(body)
        return completion(f"answer to: {body['messages'][-1]['content'][:40]}")

    with FakeServer(flaky) as server:
        root = project(tmp_path, verifier_project, _params(_openai(server.url, concurrency=1)))
        result = eagle3(root, "generate", check=False)
    assert result.returncode == 2
    done = re.search(r"; (\d+)/6 parts \((\d+)/41 samples\) are finished", _last_line(result))
    assert 1 <= int(done[1]) < 6 and int(done[2]) == 8 * int(done[1])

    with FakeServer(lambda body: completion(f"answer to: {body['messages'][-1]['content'][:40]}")) as healthy:
        # The URL is execution-only: pointing at another server resumes instead of starting over.
        write_params(root, _params(_openai(healthy.url, concurrency=1)))
        eagle3(root, "generate")
        # Only the unfinished parts were asked for again.
        assert 0 < len(healthy.requests) < 41
    out, source = records(root), prepared(root)
    for split in ("train", "heldout"):
        assert [r["id"] for r in out[split]] == [r["id"] for r in source[split]]


def test_context_overflow_is_a_counted_skip(verifier_project, tmp_path):
    def reply(body):
        if len(body["messages"][-1]["content"]) > 1000:
            return 400, {"error": {"message": "This model's maximum context length is 512 tokens. However, ..."}}
        return completion("fine")

    with FakeServer(reply) as server:
        root = project(tmp_path, verifier_project, _params(_openai(server.url)))
        eagle3(root, "generate")
    metrics = json.loads((root / "metrics/generate.json").read_text())
    assert metrics["skipped"] == {"prompt_too_long": 1} and metrics["ok"] == 40


REASONING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' and m.get('reasoning_content') %}<think>{{ m['reasoning_content'] }}</think>{% "
    "endif %}"
    "{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_reasoning_is_kept_and_rendered_as_in_serving(verifier_project, tmp_path):
    from transformers import AutoTokenizer

    def reply(body):
        question = body["messages"][-1]["content"]
        if "times" in body["messages"][0]["content"]:  # as if a reasoning parser split the thinking off
            return completion("The product is computed.", reasoning=f"I multiply for: {question}")
        return completion(f"<think>Thinking about: {question[:30]}</think>Here is my answer.")  # no parser: inline

    with FakeServer(reply) as server:
        root = project(tmp_path, verifier_project, _params(_openai(server.url), shipped_rows=120))
        eagle3(root, "generate")
        # History turns go back to the server with their reasoning, as a serving client sends them.
        follow_ups = [b for b in server.requests if len(b["messages"]) > 1 and "times" in b["messages"][0]["content"]]
        assert follow_ups and all(b["messages"][1]["reasoning"].startswith("I multiply for:") for b in follow_ups)

    flat = [r for split in records(root).values() for r in split if r["status"] == "ok"]
    parsed = [r for r in flat if "times" in r["messages"][0]["content"]]
    inline = [r for r in flat if "times" not in r["messages"][0]["content"]]
    assert parsed and inline
    assert {t["reasoning_format"] for r in parsed for t in r["turns"]} == {"field"}
    assert {t["reasoning_format"] for r in inline for t in r["turns"]} == {"inline"}
    metrics = json.loads((root / "metrics/generate.json").read_text())
    assert metrics["turns_with_reasoning"] == {
        "field": sum(len(r["turns"]) for r in parsed),
        "inline": sum(len(r["turns"]) for r in inline),
    }

    tokenizer = AutoTokenizer.from_pretrained(root / "models/verifier")
    record = parsed[0]
    question = record["messages"][0]["content"]
    tokenizer.chat_template = REASONING_TEMPLATE
    assert render(tokenizer, record["messages"][:2]) == (
        f"<|im_start|>user\n{question}<|im_end|>\n"
        f"<|im_start|>assistant\n<think>I multiply for: {question}</think>The product is computed.<|im_end|>\n"
    )
    plain = AutoTokenizer.from_pretrained(root / "models/verifier")  # SmolLM2's own template knows no reasoning field
    inline_text = inline[0]["messages"][1]["content"]
    assert inline_text.startswith("<think>Thinking about: ")
    assert f"<|im_start|>assistant\n{inline_text}<|im_end|>" in render(plain, inline[0]["messages"])


def _serve(model_dir: Path, port: int, log: Path) -> subprocess.Popen:
    return vllm_serve(model_dir, port, log, "--gpu-memory-utilization", "0.3", "--dtype", resolve("auto", "cpu"))


@pytest.mark.cpu_to_itself
def test_real_vllm_serve_killed_and_restarted_mid_run(verifier_project, tmp_path):
    port, log = free_port(), tmp_path / "serve.log"
    url = f"http://127.0.0.1:{port}/v1"
    # Retries outlast the restart (~5 min of backoff): a loaded 2-core machine took over 2 min to bring vllm serve back.
    settings = _openai(url, concurrency=4, max_retries=100, backoff_s=0.5, max_backoff_s=3.0)
    root = project(tmp_path / "project", verifier_project, _params(settings))
    server = _serve(root / "models/verifier", port, log)
    try:
        wait_healthy(port, server, log, timeout=300)
        run = subprocess.Popen(
            [sys.executable, "-m", "eagle3.cli", "generate"],
            cwd=root,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / "generate.log", "wb"),
        )
        deadline = time.monotonic() + 300
        while not list((root / "data/synthetic").glob("*/part-*")) and time.monotonic() < deadline:
            assert run.poll() is None, (tmp_path / "generate.log").read_text()[-3000:]
            time.sleep(0.2)
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        assert run.poll() is None, "generate must keep retrying while the server is down"
        server = _serve(root / "models/verifier", port, log)
        assert run.wait(timeout=600) == 0, (tmp_path / "generate.log").read_text()[-3000:]
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()

    out, source = records(root), prepared(root)
    for split in ("train", "heldout"):
        assert [r["id"] for r in out[split]] == [r["id"] for r in source[split]]  # nothing lost, nothing twice
    flat = [r for split in out.values() for r in split]
    assert [r["origin"] for r in flat if r["status"] == "skipped"] == ["long"]  # the server's 400, counted as a skip
    assert all(m["content"] for r in flat if r["status"] == "ok" for m in r["messages"])
    assert len(output_files(root)) == 2 + 5 + 1  # run.json, manifest.json, 5 train parts, 1 held-out part
    # The restarted server is the same software on the same machine: one environment made every part.
    assert len(list((root / "data/synthetic/environments").iterdir())) == 1


def test_last_turn_mode_and_history_overflow(verifier_project, tmp_path):
    with FakeServer(lambda body: completion(f"reply #{len(body['messages'])}")) as server:
        root = project(
            tmp_path / "last", verifier_project, _params({**_openai(server.url), "turns": "last"}, shipped_rows=120)
        )
        eagle3(root, "generate")
        assert len(server.requests) == sum(len(split) for split in prepared(root).values())  # one request per sample

    source = {r["id"]: r for split in prepared(root).values() for r in split}
    multi = [r for split in records(root).values() for r in split if len(source[r["id"]]["messages"]) == 3]
    assert multi
    for record in multi:
        original = source[record["id"]]["messages"]
        # Only the final reply is generated; the dataset's earlier answer stays in the history it was conditioned on.
        assert [m["content"] for m in record["messages"][:3]] == [m["content"] for m in original]
        assert record["messages"][3]["content"] == "reply #3" and len(record["turns"]) == 1

    def overflow_on_second_turn(body):
        if len(body["messages"]) > 2 and "times" in body["messages"][0]["content"]:
            return 400, {"error": {"message": "maximum context length exceeded"}}
        return completion(f"reply #{len(body['messages'])}")

    # turns: all, where the second turn overflows: the first regenerated turn is kept, the conversation ends there.
    with FakeServer(overflow_on_second_turn) as server:
        root_all = project(tmp_path / "all", verifier_project, _params(_openai(server.url), shipped_rows=120))
        eagle3(root_all, "generate")
    truncated = [r for split in records(root_all).values() for r in split if r["truncated_reason"]]
    assert truncated and all("times" in r["messages"][0]["content"] for r in truncated)
    assert all([m["role"] for m in r["messages"]] == ["user", "assistant"] for r in truncated)
    assert all(r["status"] == "ok" and len(r["turns"]) == 1 for r in truncated)
    metrics = json.loads((root_all / "metrics/generate.json").read_text())
    assert metrics["truncated_conversations"] == {"prompt_too_long": len(truncated)}


def _first_user(body: dict) -> str:
    return next(m["content"] for m in body["messages"] if m["role"] == "user")


def _is_first_turn(body: dict) -> bool:
    return not any(m["role"] == "assistant" for m in body["messages"])


def _answer(body: dict) -> tuple[int, dict]:
    """Depends only on the conversation so far, never on timing."""
    return completion(f"reply #{len(body['messages'])} to {body['messages'][-1]['content'][:30]}")


def test_skewed_latencies_keep_requests_in_flight_at_concurrency(verifier_project, tmp_path):
    """A few very slow conversations (the first of four train parts) must not hold back the others: requests in
    flight stay at `concurrency` until the last conversation has started, and the output equals a run without skew.
    With parts as the unit in flight, two parts waiting on their slow conversation left 2 of 4 slots busy."""
    concurrency, slow = 4, set()

    def delay(body: dict) -> float:
        return 2.0 if _is_first_turn(body) and _first_user(body) in slow else 0.1

    with FakeServer(_answer, delay_s=delay) as server:
        root = project(tmp_path / "skewed", verifier_project, _params(_openai(server.url, concurrency=concurrency)))
        train = prepared(root)["train"]
        slow |= {_first_user(train[row]) for row in (0, 8, 16, 24)}
        eagle3(root, "generate")
    timeline = server.in_flight
    assert max(n for _, n, _ in timeline) == concurrency
    reached = next(moment for moment, n, _ in timeline if n == concurrency)
    last_start = max(moment for moment, _, body in timeline if body is not None and _is_first_turn(body))
    assert last_start - reached > 2.0  # the slow requests fall inside the measured span
    assert server.mean_in_flight(reached, last_start) >= concurrency - 0.5

    with FakeServer(_answer) as steady:
        plain = project(tmp_path / "steady", verifier_project, _params(_openai(steady.url, concurrency=concurrency)))
        eagle3(plain, "generate")
    assert output_files(root) == output_files(plain)


def _reasoning_verifier(root: Path) -> None:
    """The project's verifier with a chat template that renders reasoning (a reasoning model's); the model files
    are hard links into the shared fixture, so the template file is replaced, never written through."""
    template = root / "models/verifier/chat_template.jinja"
    template.unlink()
    template.write_text(REASONING_TEMPLATE)


@pytest.mark.parametrize(
    "probe_answer",
    [
        completion("The product is 391."),  # served without a reasoning parser: the thinking is gone
        completion("17 times 23: 17*20 + 17*3 = 391.</think>The product is 391."),  # <think> was in the prompt
    ],
)
def test_reasoning_model_without_reasoning_fails_at_the_probe(verifier_project, tmp_path, probe_answer):
    with FakeServer(lambda body: probe_answer) as server:
        root = project(tmp_path, verifier_project, _params(_openai(server.url)))
        _reasoning_verifier(root)
        result = eagle3(root, "generate", check=False)
        assert len(server.requests) == 1  # the probe, nothing else
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert _last_line(result) == (
        f"eagle3 generate: error: generate: {server.url} returned no reasoning for a reasoning model (its chat "
        "template renders reasoning_content/<think>; the probe answer had no `reasoning` field and no <think> "
        "block); serve it with a reasoning parser (`vllm serve ... --reasoning-parser <name>`, Kimi-K2.5: kimi_k2), "
        "or set generate.openai.reasoning_check: off if thinking is off on purpose; 0/6 parts (0/41 samples) are "
        "finished and kept, rerun to continue"
    )
    assert not list((root / "data/synthetic").glob("*/part-*"))


def test_reasoning_probe_passes_template_kwargs_and_extra_body(verifier_project, tmp_path):
    def reply(body: dict) -> tuple[int, dict]:
        return completion(f"answer to {_first_user(body)[:20]}", reasoning="thinking it over")

    with FakeServer(reply) as server:
        settings = {
            **_openai(server.url, extra_body={"top_k": 5, "skip_special_tokens": False}),
            "chat_template_kwargs": {"thinking": True},
        }
        root = project(tmp_path / "checked", verifier_project, _params(settings))
        _reasoning_verifier(root)
        eagle3(root, "generate")
        bodies = server.requests
    samples = sum(len(split) for split in prepared(root).values())
    probe, *turns = bodies
    assert _first_user(probe).startswith("What is 17 times 23?") and len(turns) >= samples
    for body in bodies:
        assert body["top_k"] == 5 and body["skip_special_tokens"] is False
        assert body["chat_template_kwargs"] == {"thinking": True}
    # Every render of these conversations (extract's token layout) gets the same template arguments.
    assert {json.dumps(r["chat_template_kwargs"]) for split in records(root).values() for r in split} == {
        '{"thinking": true}'
    }

    with FakeServer(lambda body: completion("no thinking here")) as server:
        unchecked = project(tmp_path / "off", verifier_project, _params(_openai(server.url, reasoning_check="off")))
        _reasoning_verifier(unchecked)
        eagle3(unchecked, "generate")
        assert not any(_first_user(b).startswith("What is 17 times 23?") for b in server.requests)
