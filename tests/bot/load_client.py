"""The load test's client, in its own process so its timings are not slowed by the fake GitHub's work.

    python -m tests.bot.load_client URL DELIVERIES_JSON OUT_JSON CONCURRENCY
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import time

import httpx

from tests.bot.helpers import signed_headers


async def burst(url: str, deliveries: list[list[str]], concurrency: int) -> tuple[list[float], list[int]]:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    sem = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    statuses: list[int] = []
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:

        async def one(event: str, delivery: str, body_b64: str) -> None:
            body = base64.b64decode(body_b64)
            headers = signed_headers(event, body, delivery)
            async with sem:
                t0 = time.perf_counter()
                r = await client.post("/webhook", content=body, headers=headers)
                latencies.append(time.perf_counter() - t0)
                statuses.append(r.status_code)

        await asyncio.gather(*(one(*d) for d in deliveries))
    return latencies, statuses


def main() -> None:
    url, src, out, concurrency = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    with open(src) as f:
        deliveries = json.load(f)
    latencies, statuses = asyncio.run(burst(url, deliveries, concurrency))
    with open(out, "w") as f:
        json.dump({"latencies_s": latencies, "statuses": statuses}, f)


if __name__ == "__main__":
    main()
