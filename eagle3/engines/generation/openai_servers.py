"""OpenAI-compatible servers (`vllm serve` of the verifier): async, requests in flight held at `concurrency`
across parts, spread over every URL.

Each request has a deadline (`timeout_s`, for the whole answer: long reasoning answers need a long one). Before
the first part, a verifier whose chat template renders reasoning gets one probe request per server, so a server
started without its reasoning parser fails the run at once instead of silently losing the thinking text.

Retries with exponential backoff on connection errors, timeouts, 429 and 5xx,
moving to the next URL on each retry so a dead server's work flows to the live
ones; after `max_retries` consecutive failures of one request the run stops
with the URL and the reason (finished parts are already on disk). A 400 saying
the prompt exceeds the context is a skip, not a failure.
"""

import asyncio
import itertools
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import httpx

from eagle3.chat.reasoning import template_messages
from eagle3.engines.generation.base import Chunk, Conversation, Skip, TurnRequest, TurnResult
from eagle3.engines.server_access import auth_headers, vllm_version
from eagle3.errors import Eagle3Error
from eagle3.params.generate import GenerateParams

_CONTEXT_OVERFLOW = re.compile(r"maximum context length|context length|too long|exceeds", re.IGNORECASE)
_PROBE_QUESTION = "What is 17 times 23? Think it through step by step, then give the number."


class OpenAIBackend:
    def __init__(self, config: GenerateParams, reasoning_model: bool):
        """`reasoning_model`: the verifier's chat template renders reasoning (`template_renders_reasoning`)."""
        if config.openai is None:  # GenerateParams refuses backend openai without it
            raise Eagle3Error("generate.backend openai needs an `openai:` block with base_urls and model")
        self.config, self.openai = config, config.openai
        check = self.openai.reasoning_check
        self.check_reasoning = check == "require" or (check == "auto" and reasoning_model)
        self.servers = [str(url).rstrip("/") for url in self.openai.base_urls]
        self._rotation = itertools.cycle(range(len(self.servers)))
        self.headers = auth_headers(self.openai.api_key_env, "generate.openai.api_key_env")

    def process(self, chunks: Iterable[Chunk], on_done: Callable[[Chunk], None]) -> None:
        asyncio.run(self._process(iter(chunks), on_done))

    def environment(self) -> dict[str, Any]:
        """The servers compute the answers: their vLLM versions (GET /version, where a server has it); URLs stay out
        of the record, it is published."""
        versions = sorted({vllm_version(url.removesuffix("/v1"), self.headers) for url in self.servers})
        return {"backend": "openai", "servers": {"count": len(self.servers), "vllm_versions": versions}}

    def close(self) -> None:
        pass

    async def _process(self, chunks: Iterator[Chunk], on_done: Callable[[Chunk], None]) -> None:
        """`concurrency` workers, each driving one conversation at a time through all its turns and then taking the
        next one, from the next part when the current one has none left: requests in flight stay at `concurrency`
        while any conversation is unstarted, however slow a few of them are. A part is handed to `on_done` (and
        written) when its last conversation finishes, in whatever order parts finish; each worker holds at most one
        part open, so at most `concurrency` + 1 parts are in memory."""
        servers = self.openai
        unstarted = _conversations(chunks)
        remaining: dict[tuple[str, int], int] = {}

        async def worker(client: httpx.AsyncClient) -> None:
            for chunk, conversation in unstarted:
                part = (chunk.split, chunk.index)
                remaining.setdefault(part, len(chunk.conversations))
                while conversation.needs_turn:
                    conversation.accept(await self._complete(client, conversation.request()))
                remaining[part] -= 1
                if not remaining[part]:
                    del remaining[part]
                    on_done(chunk)

        # The deadline is the request's, enforced around it (`_complete`); httpx's own timeouts are per socket read.
        timeout = httpx.Timeout(None, connect=min(servers.timeout_s, 10.0))
        limits = httpx.Limits(max_connections=servers.concurrency, max_keepalive_connections=servers.concurrency)
        async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
            if self.check_reasoning:
                await self._check_reasoning(client)
            workers = [asyncio.create_task(worker(client)) for _ in range(servers.concurrency)]
            try:
                done, _ = await asyncio.wait(workers, return_when=asyncio.FIRST_EXCEPTION)
                for task in done:
                    task.result()  # the first failure stops the run; finished parts are already written
            finally:
                for task in workers:
                    task.cancel()
                await asyncio.gather(*workers, return_exceptions=True)

    async def _check_reasoning(self, client: httpx.AsyncClient) -> None:
        """One probe request per server: a reasoning model's thinking must come back, as a `reasoning` field (a
        server-side reasoning parser) or inline as `<think>...`; served without a parser, a template that opens
        `<think>` in the prompt leaves only `...</think>answer`, and the thinking cannot be rendered back."""
        probe = TurnRequest([{"role": "user", "content": _PROBE_QUESTION}], self.config.sampling.seed)
        for url in self.servers:
            answer = await self._complete(client, probe, url)
            if isinstance(answer, Skip) or answer.reasoning or answer.content.lstrip().startswith("<think>"):
                continue
            raise Eagle3Error(
                f"generate: {url} returned no reasoning for a reasoning model (its chat template renders "
                "reasoning_content/<think>; the probe answer had no `reasoning` field and no <think> block); serve "
                "it with a reasoning parser (`vllm serve ... --reasoning-parser <name>`, Kimi-K2.5: kimi_k2), or set "
                "generate.openai.reasoning_check: off if thinking is off on purpose"
            )

    async def _complete(
        self, client: httpx.AsyncClient, request: TurnRequest, only_url: str | None = None
    ) -> TurnResult | Skip:
        config, servers, sampling = self.config, self.openai, self.config.sampling
        body = {
            **servers.extra_body,
            "model": servers.model,
            "messages": template_messages(request.messages),
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_tokens,
            "seed": request.seed,
        }
        if config.chat_template_kwargs:
            body["chat_template_kwargs"] = config.chat_template_kwargs
        first = next(self._rotation)
        for attempt in range(servers.max_retries + 1):
            url = only_url or self.servers[(first + attempt) % len(self.servers)]
            try:
                async with asyncio.timeout(servers.timeout_s):
                    response = await client.post(f"{url}/chat/completions", json=body, headers=self.headers)
            except TimeoutError:
                problem = (
                    f"no answer within generate.openai.timeout_s = {servers.timeout_s:g} s; a long reasoning answer "
                    "needs more"
                )
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc}".rstrip(": ")
            else:
                if response.status_code == 200:
                    return _parse(response.json())
                if response.status_code == 400 and _CONTEXT_OVERFLOW.search(response.text):
                    return Skip("prompt_too_long")
                if response.status_code != 429 and response.status_code < 500:
                    raise Eagle3Error(f"{url} rejected the request: HTTP {response.status_code}: {response.text[:300]}")
                problem = f"HTTP {response.status_code}"
            if attempt < servers.max_retries:
                await asyncio.sleep(min(servers.backoff_s * 2**attempt, servers.max_backoff_s))
        raise Eagle3Error(f"generate: {url} failed {servers.max_retries + 1} attempts in a row (last: {problem})")


def _conversations(chunks: Iterator[Chunk]) -> Iterator[tuple[Chunk, Conversation]]:
    for chunk in chunks:
        for conversation in chunk.conversations:
            yield chunk, conversation


def _parse(payload: dict[str, Any]) -> TurnResult:
    choice = payload["choices"][0]
    message = choice.get("message") or {}
    usage = payload.get("usage") or {}
    return TurnResult(
        content=message.get("content") or "",
        reasoning=message.get("reasoning") or message.get("reasoning_content") or None,
        finish_reason=choice.get("finish_reason"),
        prompt_tokens=usage.get("prompt_tokens", 0),
        completion_tokens=usage.get("completion_tokens", 0),
    )
