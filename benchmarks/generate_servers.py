"""The openai backend against servers with skewed latencies: requests kept in flight across parts (the stage's
scheduler) beside parts as the unit in flight (the scheduler it replaced), same conversations, one process.

    python benchmarks/generate_servers.py [--parts 12] [--part-size 16] [--concurrency 8] [--slow 0.05]

A local HTTP server answers every request after `--fast-s` seconds, except a fraction `--slow` of first turns,
which take `--slow-s` (long reasoning answers). Conversations have 1-3 turns. Prints wall time, requests/s and the
server's mean in-flight count per scheduler, and the ratio. Needs no model.
"""

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import httpx  # noqa: E402

from eagle3.engines.generation.base import Chunk, Conversation  # noqa: E402
from eagle3.engines.generation.openai_servers import OpenAIBackend  # noqa: E402
from eagle3.params.generate import GenerateParams  # noqa: E402

from fake_openai import FakeServer, completion  # noqa: E402


def conversations(parts: int, part_size: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for number in range(parts * part_size):
        # Only the user turns matter: the backend regenerates every assistant turn.
        messages = [{"role": "user", "content": f"question {number}.{turn}"} for turn in range(rng.randint(1, 3))]
        rows.append({"id": f"s{number}", "messages": messages})
    return rows


def chunks(rows: list[dict], part_size: int) -> list[Chunk]:
    return [
        Chunk("train", index, [Conversation(row, "all", 0) for row in rows[start : start + part_size]])
        for index, start in enumerate(range(0, len(rows), part_size))
    ]


async def part_level(backend: OpenAIBackend, parts: list[Chunk], on_done) -> None:
    """The replaced scheduler: enough whole parts in flight to fill `concurrency` slots; a part waits for its
    slowest conversation before the next part starts."""
    servers = backend.config.openai
    limit = asyncio.Semaphore(servers.concurrency)
    window = -(-servers.concurrency // backend.config.chunk_size) + 1
    pending = iter(parts)

    async def converse(client, conversation) -> None:
        while conversation.needs_turn:
            async with limit:
                result = await backend._complete(client, conversation.request())
            conversation.accept(result)

    async def part(client, chunk) -> Chunk:
        await asyncio.gather(*(converse(client, c) for c in chunk.conversations))
        return chunk

    async with httpx.AsyncClient(timeout=None, limits=httpx.Limits(max_connections=servers.concurrency)) as client:
        in_flight = {asyncio.create_task(part(client, c)) for c in (next(pending, None) for _ in range(window)) if c}
        while in_flight:
            done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                on_done(task.result())
                following = next(pending, None)
                if following is not None:
                    in_flight.add(asyncio.create_task(part(client, following)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", type=int, default=12)
    parser.add_argument("--part-size", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--fast-s", type=float, default=0.05)
    parser.add_argument("--slow-s", type=float, default=3.0)
    parser.add_argument("--slow", type=float, default=0.05, help="fraction of first turns that are slow")
    args = parser.parse_args()

    rows = conversations(args.parts, args.part_size, seed=0)
    slow = {row["messages"][0]["content"] for row in random.Random(1).sample(rows, round(args.slow * len(rows)))}

    def delay(body: dict) -> float:
        first_turn = len(body["messages"]) == 1
        return args.slow_s if first_turn and body["messages"][0]["content"] in slow else args.fast_s

    def reply(body: dict):
        return completion(f"answer to {body['messages'][-1]['content']}")

    rates, outputs = {}, {}
    for label in ("request-level", "part-level"):
        with FakeServer(reply, delay_s=delay) as server:
            config = GenerateParams(
                backend="openai",
                chunk_size=args.part_size,
                openai={"base_urls": [server.url], "model": "m", "concurrency": args.concurrency},
            )
            backend = OpenAIBackend(config, reasoning_model=False)
            finished: list[Chunk] = []
            parts = chunks(rows, args.part_size)
            start = time.monotonic()
            if label == "request-level":
                backend.process(parts, finished.append)
            else:
                asyncio.run(part_level(backend, parts, finished.append))
            seconds = time.monotonic() - start
            requests = len(server.requests)
            busy = server.mean_in_flight(server.in_flight[0][0], server.in_flight[-1][0])
        outputs[label] = sorted((c.index, [conv.messages for conv in c.conversations]) for c in finished)
        rates[label] = requests / seconds
        print(
            f"{label:14s} {len(finished)} parts, {requests} requests in {seconds:6.2f} s = {rates[label]:6.1f} req/s, "
            f"mean in flight {busy:4.2f} of {args.concurrency}",
            flush=True,
        )
    assert outputs["request-level"] == outputs["part-level"], "both schedulers must produce the same conversations"
    print(f"\nrequest-level / part-level throughput = {rates['request-level'] / rates['part-level']:.2f}x")


if __name__ == "__main__":
    main()
