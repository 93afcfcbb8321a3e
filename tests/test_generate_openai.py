"""The openai backend: faults, skips and reasoning against scripted servers, and a real `vllm serve`
restarted mid-run."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagle3.chat.reasoning import render

from conftest import eagle3, write_params
from fake_openai import FakeServer, completion
from servers import vllm_serve, wait_healthy
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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _last_line(result) -> str:
    return result.stderr.strip().splitlines()[-1]


def test_unreachable_server_is_one_clear_error(verifier_project, tmp_path):
    url = f"http://127.0.0.1:{_free_port()}/v1"
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
        (lambda body: completion("late"), 1.5, {"timeout_s": 0.3}, "ReadTimeout"),
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
    return vllm_serve(model_dir, port, log, "--gpu-memory-utilization", "0.3", "--dtype", "bfloat16")


def test_real_vllm_serve_killed_and_restarted_mid_run(verifier_project, tmp_path):
    port, log = _free_port(), tmp_path / "serve.log"
    url = f"http://127.0.0.1:{port}/v1"
    settings = _openai(url, concurrency=4, max_retries=40, backoff_s=0.5, max_backoff_s=3.0)
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
