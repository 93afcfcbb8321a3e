"""Measure speculative decoding on running OpenAI-compatible vLLM servers (`evaluate.backend: servers`).

The hero run's verifier takes many minutes to load on 8 GPUs, and users already serve it, with the draft, behind
`vllm serve`. This module measures such servers exactly as eagle3/engines/speculative.py measures an in-process
engine: each server gets the held-out prompts (all at once, up to `concurrency` in flight) with the same sampling,
its completions come back with their token ids (`return_token_ids`) and, from a server started with
`--per-request-spec-decode-metrics detailed`, each request's own acceptance (`metrics.speculative_decoding`), from
which the figures per benchmark and their confidence intervals are computed. The deltas of the server's own
Prometheus counters (GET /metrics) taken around those requests check that nobody else used it:

    vllm:spec_decode_num_drafts_total, _num_draft_tokens_total, _num_accepted_tokens_total,
    vllm:spec_decode_num_accepted_tokens_per_pos_total{position=i}, vllm:generation_tokens_total,
    vllm:request_success_total

Counters are server-wide, so the figures are only this stage's if nobody else used the server meanwhile: a server
whose generated tokens or finished requests grew by more than this stage's own is refused. What a server serves is
the user's label (none, or the method and k); the label is checked against what the server shows: the number of
per-position acceptance counters is its k, a server without spec-decode counters speculates with nothing, and a
server started with VLLM_SERVER_DEV_MODE=1 reports its speculative config (GET /server_info), whose method and k must
match. vLLM reports neither a hash nor the config of the served draft (only its path on the server): that it is the
exported one is the label's word, and the result says so.
"""

import asyncio
import re
import time
from dataclasses import dataclass
from typing import Any

import httpx

from eagle3.engines.server_access import vllm_version
from eagle3.errors import Eagle3Error
from eagle3.params.train import DRAFT_METHODS

_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'(?P<key>[A-Za-z_][A-Za-z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)"')
_COUNTERS = {
    "vllm:spec_decode_num_drafts_total": "num_drafts",
    "vllm:spec_decode_num_draft_tokens_total": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens_total": "num_accepted_tokens",
    "vllm:generation_tokens_total": "generation_tokens",
    "vllm:request_success_total": "finished_requests",
}
_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


@dataclass(frozen=True)
class Served:
    """One endpoint and what the user says it serves."""

    url: str  # the OpenAI base URL, ending in /v1
    model: str  # the served model name
    method: str  # evaluate's Method: "none", a draft method or "ngram"
    k: int | None

    @property
    def label(self) -> str:
        return self.method if self.k is None else f"{self.method} k={self.k}"

    @property
    def root(self) -> str:
        return self.url.rstrip("/").removesuffix("/v1")


@dataclass(frozen=True)
class Retries:
    concurrency: int = 32
    timeout_s: float = 3600.0
    max_retries: int = 3
    backoff_s: float = 1.0


def parse_prometheus(text: str) -> dict[str, Any]:
    """The counters this module reads, summed over engines and label values; per-position acceptance as a list
    indexed by the `position` label. Names absent from the text are absent from the result."""
    totals: dict[str, Any] = {}
    per_position: dict[int, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        sample = _SAMPLE.match(line.strip())
        if sample is None:
            continue
        name, value = sample["name"], float(sample["value"])
        if name in _COUNTERS:
            totals[_COUNTERS[name]] = totals.get(_COUNTERS[name], 0.0) + value
        elif name == _PER_POSITION:
            labels = {m["key"]: m["value"] for m in _LABEL.finditer(sample["labels"] or "")}
            position = int(labels["position"])
            per_position[position] = per_position.get(position, 0.0) + value
    if per_position:
        totals["accepted_per_position"] = [per_position.get(i, 0.0) for i in range(max(per_position) + 1)]
    return totals


def counter_delta(served: Served, before: dict[str, Any], after: dict[str, Any], requests: int, tokens: int):
    """The spec-decode counters of this stage's own requests; refuses a server that did other work meanwhile or
    whose counters contradict its label."""
    for name in ("generation_tokens", "finished_requests"):
        if name not in after:
            raise Eagle3Error(
                f"evaluate: {served.root}/metrics has no vllm:{name.replace('finished', 'request_success')} counter; "
                "is it a vLLM server with metrics enabled?"
            )
    extra_tokens = round(after["generation_tokens"] - before["generation_tokens"]) - tokens
    extra_requests = round(after["finished_requests"] - before["finished_requests"]) - requests
    if extra_tokens < 0 or extra_requests < 0:
        raise Eagle3Error(
            f"evaluate: {served.root} ({served.label}) counted {-extra_requests} fewer requests and {-extra_tokens} "
            "fewer generated tokens than this stage received: its /metrics does not describe the server that "
            "answered (a load balancer in front of several?); point evaluate at each vLLM server directly"
        )
    if extra_tokens or extra_requests:
        raise Eagle3Error(
            f"evaluate: {served.root} ({served.label}) served other traffic during the measurement ({extra_requests} "
            f"requests and {extra_tokens} generated tokens that are not this stage's); its counters cannot be "
            "attributed: measure on a server nobody else uses"
        )
    positions = len(after.get("accepted_per_position", []))
    if served.method == "none":
        if after.get("num_drafts", 0) - before.get("num_drafts", 0):
            raise Eagle3Error(
                f"evaluate: {served.root} is labelled as serving no speculation, but it drafted tokens; fix its label"
            )
    elif "num_drafts" not in after:
        raise Eagle3Error(
            f"evaluate: {served.root} is labelled {served.label}, but it serves no speculative decoding (no "
            "vllm:spec_decode counters); start it with --speculative-config or fix its label"
        )
    elif positions != served.k:
        raise Eagle3Error(
            f"evaluate: {served.root} is labelled {served.label}, but it drafts {positions} tokens per step "
            f"(num_speculative_tokens {positions}); fix its label"
        )
    delta = {key: round(after.get(key, 0) - before.get(key, 0)) for key in _COUNTERS.values()}
    previous = before.get("accepted_per_position") or [0.0] * positions
    delta["accepted_per_position"] = [
        round(a - b) for a, b in zip(after.get("accepted_per_position", []), previous, strict=True)
    ]
    return delta


def check_server_info(served: Served, info: dict[str, Any] | None) -> str:
    """How far the server's identity could be checked (see module doc); refuses a server whose reported
    speculative config contradicts its label or the exported draft."""
    if info is None:
        return "label only: the server does not report its configuration (start it with VLLM_SERVER_DEV_MODE=1)"
    config = (info.get("vllm_config") or {}).get("speculative_config") if isinstance(info, dict) else None
    if served.method == "none":
        if config:
            raise Eagle3Error(f"evaluate: {served.root} is labelled as serving no speculation, but it does")
        return "configuration checked: no speculation"
    if not isinstance(config, dict):
        raise Eagle3Error(f"evaluate: {served.root} is labelled {served.label}, but reports no speculative config")
    method, k = config.get("method"), config.get("num_speculative_tokens")
    if method != served.method or k != served.k:
        raise Eagle3Error(
            f"evaluate: {served.root} is labelled {served.label}, but serves {method} k={k}; fix its label"
        )
    if served.method not in DRAFT_METHODS:
        return f"configuration checked: {method} k={k}"
    # The dump names the draft by the server's own path and holds none of its config: only method and k compare.
    return (
        f"configuration checked: {method} k={k}; that it is the exported draft is the label's word (vLLM reports no "
        "hash)"
    )


class ServerClient:
    """Sends one batch of prompts to one server and reads its counters around it."""

    def __init__(
        self,
        served: Served,
        retries: Retries,
        headers: dict[str, str],
        template_kwargs: dict[str, Any] | None = None,
        settle_s: float = 10.0,
    ):
        self.served, self.retries, self.headers, self.settle_s = served, retries, headers, settle_s
        # Passed to the server's chat template with every prompt, as generate passed them.
        self.template_kwargs = template_kwargs or {}

    def metrics(self) -> dict[str, Any]:
        response = self._get("/metrics")
        return parse_prometheus(response.text)

    def server_info(self) -> dict[str, Any] | None:
        try:
            response = httpx.get(
                f"{self.served.root}/server_info", params={"config_format": "json"}, headers=self.headers, timeout=30
            )
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        try:
            return response.json()
        except ValueError:
            return None

    def version(self) -> str:
        return vllm_version(self.served.root, self.headers)

    def measure(self, prompts: list[list[dict[str, str]]], temperature: float, max_tokens: int, seed: int):
        """Completions and counter deltas of one batch, in the shape eagle3/engines/speculative.py returns."""
        before = self.metrics()
        started = time.monotonic()
        completions = asyncio.run(self._batch(prompts, temperature, max_tokens, seed))
        seconds = time.monotonic() - started
        tokens = sum(len(c["token_ids"]) for c in completions)
        after = self._settled(before, len(prompts), tokens)
        return {
            "sampling": {"temperature": temperature, "max_tokens": max_tokens, "seed": seed},
            "seconds": round(seconds, 3),
            "completions": completions,
            "counters": counter_delta(self.served, before, after, len(prompts), tokens),
            "repaired_token_expansion": False,
        }

    def _settled(self, before: dict[str, Any], requests: int, tokens: int) -> dict[str, Any]:
        """The counters once they include this batch: vLLM records a step's stats just after sending its output, so
        the last responses can arrive before their counts do."""
        deadline = time.monotonic() + self.settle_s
        while True:
            after = self.metrics()
            grown = all(
                after.get(name, 0) - before.get(name, 0) >= expected
                for name, expected in (("finished_requests", requests), ("generation_tokens", tokens))
            )
            if grown or time.monotonic() > deadline:
                return after
            time.sleep(0.1)

    def _get(self, path: str) -> httpx.Response:
        problem = ""
        for attempt in range(self.retries.max_retries + 1):
            try:
                response = httpx.get(f"{self.served.root}{path}", headers=self.headers, timeout=30)
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc}".rstrip(": ")
            else:
                if response.status_code == 200:
                    return response
                problem = f"HTTP {response.status_code}"
                if response.status_code < 500:
                    break
            if attempt < self.retries.max_retries:
                time.sleep(self.retries.backoff_s * 2**attempt)
        raise Eagle3Error(f"evaluate: {self.served.root}{path} ({self.served.label}) failed: {problem}")

    async def _batch(self, prompts, temperature: float, max_tokens: int, seed: int) -> list[dict[str, Any]]:
        limit = asyncio.Semaphore(self.retries.concurrency)
        timeout = httpx.Timeout(self.retries.timeout_s, connect=min(self.retries.timeout_s, 10.0))
        async with httpx.AsyncClient(
            timeout=timeout, limits=httpx.Limits(max_connections=self.retries.concurrency)
        ) as client:
            return await asyncio.gather(
                *(self._complete(client, limit, p, temperature, max_tokens, seed) for p in prompts)
            )

    async def _complete(self, client, limit, messages, temperature: float, max_tokens: int, seed: int):
        body = {
            "model": self.served.model,
            "messages": messages,
            "temperature": temperature,
            "top_p": 1.0,
            "max_tokens": max_tokens,
            "seed": seed,
            "return_token_ids": True,
        }
        if self.template_kwargs:
            body["chat_template_kwargs"] = self.template_kwargs
        problem = ""
        for attempt in range(self.retries.max_retries + 1):
            async with limit:
                try:
                    response = await client.post(
                        f"{self.served.url.rstrip('/')}/chat/completions", json=body, headers=self.headers
                    )
                except httpx.TransportError as exc:
                    problem = f"{type(exc).__name__}: {exc}".rstrip(": ")
                else:
                    if response.status_code == 200:
                        try:
                            payload = response.json()
                        except ValueError:
                            raise Eagle3Error(
                                f"evaluate: {self.served.url} ({self.served.label}) answered HTTP 200 with a body that "
                                f"is not JSON: {response.text[:200]!r}"
                            ) from None
                        return self._completion(payload)
                    if response.status_code != 429 and response.status_code < 500:
                        raise Eagle3Error(
                            f"evaluate: {self.served.url} ({self.served.label}) rejected a prompt: HTTP "
                            f"{response.status_code}: {response.text[:300]}"
                        )
                    problem = f"HTTP {response.status_code}"
            if attempt < self.retries.max_retries:
                await asyncio.sleep(self.retries.backoff_s * 2**attempt)
        raise Eagle3Error(
            f"evaluate: {self.served.url} ({self.served.label}) failed {self.retries.max_retries + 1} attempts in a "
            f"row (last: {problem})"
        )

    def _completion(self, payload: Any) -> dict[str, Any]:
        """Token ids, prompt length, text and (speculating servers) the request's own acceptance of one chat
        completion."""
        where = f"evaluate: {self.served.url} ({self.served.label})"
        choices = payload.get("choices") if isinstance(payload, dict) else None
        choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
        if choice is None:
            raise Eagle3Error(f"{where} returned a completion without choices; is it an OpenAI-compatible vLLM server?")
        token_ids = choice.get("token_ids")
        if not isinstance(token_ids, list) or not all(isinstance(t, int) for t in token_ids):
            raise Eagle3Error(
                f"{where} returned no token ids (return_token_ids needs vLLM >= 0.10.2); upgrade the server"
            )
        usage = payload.get("usage")
        prompt_tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        if not isinstance(prompt_tokens, int) or isinstance(prompt_tokens, bool) or prompt_tokens < 0:
            raise Eagle3Error(f"{where} returned a completion without usage.prompt_tokens; is it a vLLM server?")
        message = choice.get("message")
        text = (message.get("content") if isinstance(message, dict) else None) or ""
        if self.served.method == "none":
            return {"token_ids": token_ids, "prompt_tokens": prompt_tokens, "text": text, "spec": None}
        metrics = payload.get("metrics")
        summary = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
        summary = summary if isinstance(summary, dict) else {}
        histogram, drafted, steps = (
            summary.get(key) for key in ("acceptance_histogram", "num_draft_tokens", "per_step_accepted")
        )
        numbers = [histogram, steps]
        if not all(isinstance(v, list) and all(isinstance(n, int) and n >= 0 for n in v) for v in numbers) or not (
            isinstance(drafted, int) and isinstance(histogram, list) and len(histogram) == (self.served.k or 0) + 1
        ):
            raise Eagle3Error(
                f"{where} returned no per-request acceptance for k={self.served.k} (metrics.speculative_decoding with "
                "per_step_accepted): start it with --per-request-spec-decode-metrics detailed (vLLM >= 0.32)"
            )
        return {
            "token_ids": token_ids,
            "prompt_tokens": prompt_tokens,
            "text": text,
            "spec": {"histogram": histogram, "draft_tokens": drafted, "steps": steps},
        }
