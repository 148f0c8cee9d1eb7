"""The load test's client, in its own process so its timings are not slowed by the fake GitHub's work.

    python -m tests.bot.load_client URL DELIVERIES_JSON OUT_JSON CONCURRENCY

CONCURRENCY keep-alive connections, each sending its next delivery as soon as the previous one is answered. It
speaks HTTP/1.1 through h11 over asyncio streams. (httpx's AsyncClient was tried first: on two shared cores its own
per-request work put seconds into the tail of what it measured, p99 ~2 s against ~0.15 s with this client at 64
connections, same server.)
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import time

import h11

from tests.bot.helpers import signed_headers


async def connection(host: str, port: int, queue: asyncio.Queue, latencies: list[float], statuses: list[int]) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    conn = h11.Connection(h11.CLIENT)
    try:
        while not queue.empty():
            event, delivery, body_b64 = queue.get_nowait()
            body = base64.b64decode(body_b64)
            signed = signed_headers(event, body, delivery)
            headers = [("Host", host), ("Content-Length", str(len(body))), *signed.items()]
            t0 = time.perf_counter()
            writer.write(conn.send(h11.Request(method="POST", target="/webhook", headers=headers)))
            writer.write(conn.send(h11.Data(data=body)))
            writer.write(conn.send(h11.EndOfMessage()))
            await writer.drain()
            status = 0
            while True:
                ev = conn.next_event()
                if ev is h11.NEED_DATA:
                    conn.receive_data(await reader.read(65536))
                elif isinstance(ev, h11.Response):
                    status = ev.status_code
                elif isinstance(ev, h11.EndOfMessage):
                    break
            latencies.append(time.perf_counter() - t0)
            statuses.append(status)
            conn.start_next_cycle()
    finally:
        writer.close()


async def burst(url: str, deliveries: list[list[str]], concurrency: int) -> tuple[list[float], list[int]]:
    host, port = url.removeprefix("http://").split(":")
    queue: asyncio.Queue = asyncio.Queue()
    for d in deliveries:
        queue.put_nowait(d)
    latencies: list[float] = []
    statuses: list[int] = []
    await asyncio.gather(*(connection(host, int(port), queue, latencies, statuses) for _ in range(concurrency)))
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
