"""A minimal OpenAI-compatible HTTP server on 127.0.0.1 whose answers a test scripts: faults and reasoning shapes
that a real `vllm serve` of the embedded verifier cannot be made to produce on demand."""

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = Callable[[dict[str, Any]], tuple[int, dict[str, Any]]]


def completion(content: str, reasoning: str | None = None, finish_reason: str = "stop") -> tuple[int, dict[str, Any]]:
    message = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning"] = reasoning
    return 200, {
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7},
    }


class FakeServer:
    """`delay_s`: seconds before each answer, or a function of the request body (skewed latencies).
    `in_flight`: (time.monotonic(), requests being answered, body) at every arrival and (..., None) at every
    departure."""

    def __init__(self, reply: Reply, delay_s: float | Callable[[dict[str, Any]], float] = 0.0):
        self.requests: list[dict[str, Any]] = []
        self.in_flight: list[tuple[float, int, dict[str, Any] | None]] = []
        lock = threading.Lock()
        answering = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                nonlocal answering
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    server.requests.append(body)
                    answering += 1
                    server.in_flight.append((time.monotonic(), answering, body))
                time.sleep(delay_s(body) if callable(delay_s) else delay_s)
                status, payload = reply(body)
                with lock:
                    answering -= 1
                    server.in_flight.append((time.monotonic(), answering, None))
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def mean_in_flight(self, start: float, end: float) -> float:
        """Time-weighted mean of the requests being answered over [start, end] (time.monotonic())."""
        total, count, last = 0.0, 0, start
        for moment, answering, _ in self.in_flight:
            if moment > end:
                break
            if moment > start:
                total += count * (moment - last)
                last = moment
            count = answering
        return (total + count * (end - last)) / (end - start)

    def __enter__(self) -> "FakeServer":
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
