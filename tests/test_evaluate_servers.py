"""evaluate against running servers (eagle3/engines/served_speculation.py): Prometheus counters, refusals, labels.
A fake vLLM here scripts what a real server cannot be made to do on demand (another client's traffic mid-run, a
wrong label); the real `vllm serve` comparison with the in-process figures runs on the smoke pipeline's draft
(tests/test_pipeline.py: check_servers_match_in_process)."""

import contextlib
import json
import os
import signal
import subprocess
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from eagle3.engines.acceptance import counters_agree
from eagle3.engines.measurers import ServerMeasurer
from eagle3.engines.served_speculation import (
    Retries,
    Served,
    ServerClient,
    check_server_info,
    counter_delta,
    parse_prometheus,
)
from eagle3.errors import Eagle3Error
from eagle3.params.evaluate import EvaluateParams

from conftest import eagle3, write_params
from servers import free_port, vllm_serve, wait_healthy

METRICS = """# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="verifier"} 100.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="verifier"} 3.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="verifier"} 5.0
vllm:request_success_created{engine="0",finished_reason="stop",model_name="verifier"} 1.7e+09
vllm:spec_decode_num_drafts_total{engine="0",model_name="verifier"} 40.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="verifier"} 120.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="verifier"} 50.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="verifier",position="1"} 20.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="verifier",position="0"} 30.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="verifier",position="0"} 1.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="verifier",position="2"} 0.0
"""

DRAFT = Served("http://127.0.0.1:1/v1", "verifier", "eagle3", 3)


def test_prometheus_counters_summed_over_engines_and_labels():
    assert parse_prometheus(METRICS) == {
        "generation_tokens": 100.0,
        "finished_requests": 8.0,  # stop + length; the _created sample is not a count
        "num_drafts": 40.0,
        "num_draft_tokens": 120.0,
        "num_accepted_tokens": 50.0,
        "accepted_per_position": [31.0, 20.0, 0.0],  # by the position label, engines summed
    }
    assert parse_prometheus("vllm:generation_tokens_total 7\n") == {"generation_tokens": 7.0}


def _counters(tokens, requests, drafts=0, accepted=(0, 0, 0)):
    found = {"generation_tokens": tokens, "finished_requests": requests}
    if accepted is not None:
        found |= {
            "num_drafts": drafts,
            "num_draft_tokens": 3 * drafts,
            "num_accepted_tokens": sum(accepted),
            "accepted_per_position": list(accepted),
        }
    return found


def test_counter_deltas_are_this_stages_and_other_traffic_is_refused():
    before, after = _counters(100, 8, 40, (30, 20, 0)), _counters(160, 10, 60, (45, 25, 2))
    assert counter_delta(DRAFT, before, after, requests=2, tokens=60) == {
        "num_drafts": 20,
        "num_draft_tokens": 60,
        "num_accepted_tokens": 22,
        "generation_tokens": 60,
        "finished_requests": 2,
        "accepted_per_position": [15, 5, 2],
    }
    with pytest.raises(Eagle3Error, match=r"served other traffic during the measurement \(1 requests and 7 generated"):
        counter_delta(DRAFT, before, _counters(167, 11, 60, (45, 25, 2)), requests=2, tokens=60)
    # Behind a load balancer the counters are another server's: fewer than this stage's own requests.
    with pytest.raises(Eagle3Error, match="counted 1 fewer requests and 30 fewer generated tokens than this stage"):
        counter_delta(DRAFT, before, _counters(130, 9, 60, (45, 25, 2)), requests=2, tokens=60)


def test_labels_are_checked_against_the_counters():
    before = _counters(0, 0, 0, (0, 0))
    with pytest.raises(Eagle3Error, match="labelled eagle3 k=3, but it drafts 2 tokens per step"):
        counter_delta(DRAFT, before, _counters(5, 1, 2, (1, 1)), requests=1, tokens=5)
    plain = _counters(0, 0, accepted=None)
    with pytest.raises(Eagle3Error, match="labelled eagle3 k=3, but it serves no speculative decoding"):
        counter_delta(DRAFT, plain, _counters(5, 1, accepted=None), requests=1, tokens=5)
    none = Served("http://127.0.0.1:1/v1", "verifier", "none", None)
    with pytest.raises(Eagle3Error, match="labelled as serving no speculation, but it drafted tokens"):
        counter_delta(none, before, _counters(5, 1, 2, (1, 1)), requests=1, tokens=5)
    assert counter_delta(none, plain, _counters(5, 1, accepted=None), requests=1, tokens=5)["num_drafts"] == 0


def test_reported_speculative_config_must_match_the_label():
    assert check_server_info(DRAFT, None).startswith("label only")

    def info(method, k):
        return {"vllm_config": {"speculative_config": {"method": method, "num_speculative_tokens": k}}}

    assert check_server_info(DRAFT, info("eagle3", 3)).startswith("configuration checked: eagle3 k=3; that it is")
    with pytest.raises(Eagle3Error, match="labelled eagle3 k=3, but serves ngram k=3"):
        check_server_info(DRAFT, info("ngram", 3))
    with pytest.raises(Eagle3Error, match="labelled eagle3 k=3, but serves eagle3 k=5"):
        check_server_info(DRAFT, info("eagle3", 5))
    none = Served("http://127.0.0.1:1/v1", "verifier", "none", None)
    with pytest.raises(Eagle3Error, match="labelled as serving no speculation, but it does"):
        check_server_info(none, info("eagle3", 3))
    assert check_server_info(none, {"vllm_config": {"speculative_config": None}}).endswith("no speculation")


class FakeVllm:
    """Answers chat completions with `tokens` token ids and keeps vLLM's counters as a k=3 draft would; `intruder`
    tokens are counted as if another client had been served at the same time."""

    def __init__(self, tokens: int = 6, intruder: int = 0, per_request: bool = True, usage: bool = True):
        self.counters = {"generation": 0, "requests": 0, "drafts": 0, "accepted": [0, 0, 0]}
        self.bodies = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                c = fake.counters
                if self.path == "/metrics":
                    lines = [
                        f'vllm:generation_tokens_total{{engine="0"}} {c["generation"]}',
                        f'vllm:request_success_total{{finished_reason="length"}} {c["requests"]}',
                        f"vllm:spec_decode_num_drafts_total {c['drafts']}",
                        f"vllm:spec_decode_num_draft_tokens_total {3 * c['drafts']}",
                        f"vllm:spec_decode_num_accepted_tokens_total {sum(c['accepted'])}",
                    ] + [
                        f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} {n}'
                        for i, n in enumerate(c["accepted"])
                    ]
                    self._send(200, "\n".join(lines) + "\n", "text/plain")
                elif self.path == "/version":
                    self._send(200, json.dumps({"version": "0.32.0"}), "application/json")
                else:
                    self._send(404, "{}", "application/json")

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.bodies.append(body)
                c = fake.counters
                c["generation"] += tokens + intruder
                c["requests"] += 1
                c["drafts"] += 2
                c["accepted"] = [c["accepted"][0] + 2, c["accepted"][1] + 1, c["accepted"][2]]
                choice = {"message": {"content": "x" * tokens}, "token_ids": list(range(tokens))}
                reply = {"choices": [choice]}
                if usage:
                    reply["usage"] = {"prompt_tokens": 9, "completion_tokens": tokens}
                if per_request:  # what --per-request-spec-decode-metrics detailed adds: one step took 2, then 1
                    summary = {
                        "acceptance_histogram": [0, 1, 1, 0],
                        "num_draft_tokens": 6,
                        "num_spec_tokens": 3,
                        "per_step_accepted": [2, 1],
                        "per_step_drafted": [3, 3],
                    }
                    reply["metrics"] = {"speculative_decoding": summary}
                self._send(200, json.dumps(reply), "application/json")

            def _send(self, status, text, kind):
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_batch_measured_from_the_servers_own_counters():
    server = FakeVllm(tokens=6)
    try:
        client = ServerClient(Served(server.url, "verifier", "eagle3", 3), Retries(concurrency=2), {}, settle_s=0.5)
        prompts = [[{"role": "user", "content": f"q{i}"}] for i in range(4)]
        result = client.measure(prompts, temperature=0.0, max_tokens=6, seed=7)
        assert [c["token_ids"] for c in result["completions"]] == [list(range(6))] * 4
        assert [c["prompt_tokens"] for c in result["completions"]] == [9] * 4
        spec = {"histogram": [0, 1, 1, 0], "draft_tokens": 6, "steps": [2, 1]}
        assert [c["spec"] for c in result["completions"]] == [spec] * 4
        assert counters_agree(result["completions"], result["counters"])
        assert result["counters"] == {
            "num_drafts": 8,
            "num_draft_tokens": 24,
            "num_accepted_tokens": 12,
            "generation_tokens": 24,
            "finished_requests": 4,
            "accepted_per_position": [8, 4, 0],
        }
        sent = server.bodies[0]
        assert sent["return_token_ids"] is True and sent["temperature"] == 0.0 and sent["seed"] == 7
        assert sent["max_tokens"] == 6 and sent["model"] == "verifier" and client.version() == "0.32.0"
    finally:
        server.close()


def test_a_speculating_server_without_per_request_acceptance_is_one_error():
    server = FakeVllm(tokens=6, per_request=False)
    try:
        client = ServerClient(Served(server.url, "verifier", "eagle3", 3), Retries(), {}, settle_s=0.2)
        with pytest.raises(Eagle3Error, match="start it with --per-request-spec-decode-metrics detailed"):
            client.measure([[{"role": "user", "content": "a"}]], 0.0, 6, 0)
    finally:
        server.close()


def test_a_server_that_does_not_say_how_long_the_prompt_was_is_one_error():
    server = FakeVllm(tokens=6, usage=False)
    try:
        client = ServerClient(Served(server.url, "verifier", "eagle3", 3), Retries(), {}, settle_s=0.2)
        with pytest.raises(Eagle3Error, match=r"\(eagle3 k=3\) returned a completion without usage.prompt_tokens"):
            client.measure([[{"role": "user", "content": "a"}]], 0.0, 6, 0)
    finally:
        server.close()


def test_a_server_with_other_traffic_is_refused():
    server = FakeVllm(tokens=6, intruder=3)
    try:
        client = ServerClient(Served(server.url, "verifier", "eagle3", 3), Retries(), {}, settle_s=0.2)
        with pytest.raises(
            Eagle3Error,
            match=r"\(eagle3 k=3\) served other traffic during the measurement \(0 requests and 6 generated",
        ):
            client.measure([[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]], 0.0, 6, 0)
    finally:
        server.close()


def test_an_unreachable_server_is_one_error():
    client = ServerClient(
        Served("http://127.0.0.1:9/v1", "m", "none", None), Retries(max_retries=1, backoff_s=0.01), {}
    )
    with pytest.raises(Eagle3Error, match=r"evaluate: http://127.0.0.1:9/metrics \(none\) failed: ConnectError"):
        client.measure([[{"role": "user", "content": "a"}]], 0.0, 4, 0)


def _serve(root: Path, port: int, log: Path, speculative: dict | None, core: int) -> subprocess.Popen:
    """The project's verifier in float32, as the smoke evaluation runs it; dev mode on so the server reports its
    configuration (/server_info). Each server's OpenMP threads on a core of their own: two servers spin-waiting
    on the same cores starved one engine step past vLLM's 300 s RPC timeout here."""
    options = ["--dtype", "float32", "--seed", "0"]
    if speculative:
        options += ["--speculative-config", json.dumps(speculative), "--per-request-spec-decode-metrics", "detailed"]
    cores = sorted(os.sched_getaffinity(0))
    env = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_OMP_THREADS_BIND": str(cores[core % len(cores)])}
    return vllm_serve(root / "models/verifier", port, log, *options, env=env)


def check_servers_match_in_process(root: Path, scratch: Path) -> None:
    """The smoke pipeline's draft served by two real `vllm serve` processes (the draft at k=3, and no speculation):
    `evaluate` against them gives the in-process figures for the same prompts, and refuses a server that another
    client uses during the measurement. Leaves the in-process evaluation's outputs as it found them."""
    # What evaluate writes, as the in-process run left it.
    outputs = {
        path: path.read_bytes()
        for path in [root / "metrics/eval.json", root / "reports/eval.png", root / "reports/eval_benchmarks.png"]
    }
    outputs |= {path: path.read_bytes() for path in (root / "metrics/eval").glob("*.csv")}
    in_process = json.loads(outputs[root / "metrics/eval.json"])
    ports = {"eagle3": free_port(), "none": free_port()}
    draft = {"method": "eagle3", "model": str(root / "models/draft"), "num_speculative_tokens": 3}
    processes = {
        "eagle3": _serve(root, ports["eagle3"], scratch / "draft.log", draft, core=0),
        "none": _serve(root, ports["none"], scratch / "plain.log", None, core=1),
    }
    params_path = root / "params.yaml"
    original = params_path.read_text()
    try:
        for name, process in processes.items():
            wait_healthy(ports[name], process, scratch / ("draft.log" if name == "eagle3" else "plain.log"))
        params = yaml.safe_load(original)
        params["evaluate"]["backend"] = "servers"
        params["evaluate"]["servers"] = {
            "endpoints": [
                {"url": f"http://127.0.0.1:{ports['none']}/v1", "model": "verifier", "serves": "none"},
                {"url": f"http://127.0.0.1:{ports['eagle3']}/v1", "model": "verifier", "serves": "eagle3", "k": 3},
            ],
            "concurrency": 8,
        }
        write_params(root, params)
        eagle3(root, "evaluate")
        served = json.loads((root / "metrics/eval.json").read_text())
        assert served["prompts"]["prompt_hashes"] == in_process["prompts"]["prompt_hashes"]
        assert {(r["method"], r["k"]) for r in served["runs"]} == {("none", None), ("eagle3", 3)}
        headline, reference = served["headline"], in_process["headline"]
        assert abs(headline["tokens_per_step_greedy"] - reference["tokens_per_step_greedy"]) <= 0.03
        assert headline["ngram_tokens_per_step_greedy"] is None  # no n-gram server: not measured, not invented
        assert headline["lossless_greedy"] == "8/8" and served["lossless"]["exact_expected"] is False
        # The offline estimate reads only this machine's states: the same; its comparison is with each run's own
        # vLLM figure, which may differ within the bound above (servers batch differently).
        vllm_figures = ("vllm_tokens_per_step", "gap")
        offline, offline_in_process = served["offline_estimate"], in_process["offline_estimate"]
        assert {k: v for k, v in offline.items() if k not in vllm_figures} == {
            k: v for k, v in offline_in_process.items() if k not in vllm_figures
        }
        assert offline["vllm_tokens_per_step"] == headline["tokens_per_step_greedy"]
        # The benchmarks too, turn by turn after the plain server's greedy answers: the same tokens as in-process.
        assert list(served["benchmarks"]) == list(in_process["benchmarks"]) == ["humaneval", "mt-bench"]
        for name, entry in served["benchmarks"].items():
            here = {(r["method"], r["k"], r["temperature"]): r for r in in_process["benchmarks"][name]["results"]}
            for result in entry["results"]:
                reference = here[(result["method"], result["k"], result["temperature"])]
                if result["temperature"] == 0.0:  # each turn's greedy answer with the draft equals the plain server's
                    assert result["lossless_identical"] == result["completions"] == reference["completions"], name
                    assert abs(result["tokens_per_step"] - reference["tokens_per_step"]) <= 0.05, name
        identities = {s["serves"]: s["identity"] for s in served["environment"]["servers"]}
        assert identities["eagle3 k=3"].startswith("configuration checked: eagle3 k=3")
        assert all(s["vllm"] != "unknown" for s in served["environment"]["servers"])

        # Another client on the draft's server while the stage measures it: refused, nothing written. The refusal
        # comes after the first batch, so one held-out prompt and short answers make that batch.
        params["evaluate"]["servers"]["endpoints"] = params["evaluate"]["servers"]["endpoints"][1:]
        params["evaluate"].update(max_prompts=1, max_tokens=8)
        write_params(root, params)
        (root / "metrics/eval.json").unlink()
        stop = threading.Event()

        def intrude() -> None:
            body = json.dumps(
                {"model": "verifier", "messages": [{"role": "user", "content": "Count to ten."}], "max_tokens": 16}
            ).encode()
            while not stop.is_set():
                request = urllib.request.Request(
                    f"http://127.0.0.1:{ports['eagle3']}/v1/chat/completions",
                    body,
                    {"Content-Type": "application/json"},
                )
                with contextlib.suppress(OSError):
                    urllib.request.urlopen(request, timeout=60).read()

        intruder = threading.Thread(target=intrude, daemon=True)
        intruder.start()
        try:
            result = eagle3(root, "evaluate", check=False)
        finally:
            stop.set()
            intruder.join(timeout=120)
        assert result.returncode == 2, result.stderr[-2000:]
        assert f":{ports['eagle3']} (eagle3 k=3) served other traffic during the measurement" in result.stderr
        assert "Traceback" not in result.stderr and not (root / "metrics/eval.json").exists()
    finally:
        for process in processes.values():
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        params_path.write_text(original)
        for path, content in outputs.items():
            path.write_bytes(content)


def test_servers_are_asked_with_generates_template_arguments():
    server = FakeVllm(tokens=4)
    try:
        endpoint = {"url": server.url, "model": "verifier", "serves": "eagle3", "k": 3}
        config = EvaluateParams(backend="servers", servers={"endpoints": [endpoint]})
        measurer = ServerMeasurer(config, {"enable_thinking": False})
        conversation = {"first": [{"role": "user", "content": "q"}], "later": ["and then?"]}
        measurer.measure("eagle3", 3, [conversation], [["an answer"]], (0.0,), None)
        assert len(server.bodies) == 2  # both turns
        assert all(body["chat_template_kwargs"] == {"enable_thinking": False} for body in server.bodies)
        ServerMeasurer(config, {}).measure("eagle3", 3, [conversation], [["an answer"]], (0.0,), None)
        assert "chat_template_kwargs" not in server.bodies[-1]
    finally:
        server.close()
