"""OpenAI-compatible servers (`vllm serve` of the verifier): async, bounded concurrency, spread over every URL.

Retries with exponential backoff on connection errors, timeouts, 429 and 5xx,
moving to the next URL on each retry so a dead server's work flows to the live
ones; after `max_retries` consecutive failures of one request the run stops
with the URL and the reason (finished parts are already on disk). A 400 saying
the prompt exceeds the context is a skip, not a failure.
"""

import asyncio
import itertools
import re
from collections.abc import Callable, Iterable
from typing import Any

import httpx

from eagle3.chat.reasoning import template_messages
from eagle3.engines.generation.base import Chunk, Skip, TurnRequest, TurnResult
from eagle3.engines.server_access import auth_headers, vllm_version
from eagle3.errors import Eagle3Error
from eagle3.params.generate import GenerateParams

_CONTEXT_OVERFLOW = re.compile(r"maximum context length|context length|too long|exceeds", re.IGNORECASE)


class OpenAIBackend:
    def __init__(self, config: GenerateParams):
        self.config = config
        self.servers = [str(url).rstrip("/") for url in config.openai.base_urls]
        self._rotation = itertools.cycle(range(len(self.servers)))
        self.headers = auth_headers(config.openai.api_key_env, "generate.openai.api_key_env")

    def process(self, chunks: Iterable[Chunk], on_done: Callable[[Chunk], None]) -> None:
        asyncio.run(self._process(iter(chunks), on_done))

    def environment(self) -> dict[str, Any]:
        """The servers compute the answers: their vLLM versions (GET /version, where a server has it); URLs stay out
        of the record, it is published."""
        versions = sorted({vllm_version(url.removesuffix("/v1"), self.headers) for url in self.servers})
        return {"backend": "openai", "servers": {"count": len(self.servers), "vllm_versions": versions}}

    def close(self) -> None:
        pass

    async def _process(self, chunks, on_done: Callable[[Chunk], None]) -> None:
        servers = self.config.openai
        limit = asyncio.Semaphore(servers.concurrency)
        # Enough parts in flight to keep every request slot busy while the slowest part finishes.
        window = -(-servers.concurrency // self.config.chunk_size) + 1
        timeout = httpx.Timeout(servers.timeout_s, connect=min(servers.timeout_s, 10.0))
        async with httpx.AsyncClient(
            timeout=timeout, limits=httpx.Limits(max_connections=servers.concurrency)
        ) as client:
            in_flight: set[asyncio.Task] = set()

            def launch() -> None:
                chunk = next(chunks, None)
                if chunk is not None:
                    in_flight.add(asyncio.create_task(self._chunk(client, limit, chunk)))

            for _ in range(window):
                launch()
            try:
                while in_flight:
                    done, _ = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        in_flight.discard(task)
                        on_done(task.result())
                        launch()
            finally:
                for task in in_flight:
                    task.cancel()
                await asyncio.gather(*in_flight, return_exceptions=True)

    async def _chunk(self, client: httpx.AsyncClient, limit: asyncio.Semaphore, chunk: Chunk) -> Chunk:
        async def converse(conversation) -> None:
            while conversation.needs_turn:
                conversation.accept(await self._complete(client, limit, conversation.request()))

        await asyncio.gather(*(converse(c) for c in chunk.conversations))
        return chunk

    async def _complete(
        self, client: httpx.AsyncClient, limit: asyncio.Semaphore, request: TurnRequest
    ) -> TurnResult | Skip:
        servers, sampling = self.config.openai, self.config.sampling
        body = {
            "model": servers.model,
            "messages": template_messages(request.messages),
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_tokens,
            "seed": request.seed,
        }
        first = next(self._rotation)
        for attempt in range(servers.max_retries + 1):
            url = self.servers[(first + attempt) % len(self.servers)]
            async with limit:
                try:
                    response = await client.post(f"{url}/chat/completions", json=body, headers=self.headers)
                except httpx.TransportError as exc:
                    problem = f"{type(exc).__name__}: {exc}".rstrip(": ")
                else:
                    if response.status_code == 200:
                        return _parse(response.json())
                    if response.status_code == 400 and _CONTEXT_OVERFLOW.search(response.text):
                        return Skip("prompt_too_long")
                    if response.status_code != 429 and response.status_code < 500:
                        raise Eagle3Error(
                            f"{url} rejected the request: HTTP {response.status_code}: {response.text[:300]}"
                        )
                    problem = f"HTTP {response.status_code}"
            if attempt < servers.max_retries:
                await asyncio.sleep(min(servers.backoff_s * 2**attempt, servers.max_backoff_s))
        raise Eagle3Error(f"generate: {url} failed {servers.max_retries + 1} attempts in a row (last: {problem})")


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
