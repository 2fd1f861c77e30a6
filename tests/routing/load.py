"""Steady client load in a background thread, recording what every client saw, for the fault tests.

Each worker sends one request after another (closed loop) until `stop()`; every answer is kept as a
`Sample` with its send and end times (monotonic clock of this process), so a test can split what
clients saw before, during and after the fault it injected.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson


@dataclass(slots=True)
class Sample:
    label: str
    started: float
    ended: float
    status: int  # 0: no HTTP answer (connection refused or reset)
    code: str = ""  # the OpenAI error code of an error answer, or of an SSE error event mid-stream
    stream_error: bool = False  # a 200 stream that ended with an error event
    transport_error: str = ""


@dataclass
class Client:
    label: str
    url: str
    key: str
    body: dict[str, Any]
    concurrency: int = 1
    # When set, each request's (body, extra headers) comes from it instead of `body` (mixed load).
    make: Callable[[random.Random], tuple[dict[str, Any], dict[str, str]]] | None = None


class Load:
    def __init__(self, clients: Iterable[Client], timeout: float = 30.0, pause: float = 0.0) -> None:
        self.clients = list(clients)
        self.timeout = timeout
        self.pause = pause
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> list[Sample]:
        self._stop.set()
        self._thread.join(self.timeout + 10)
        return self.samples

    def between(self, start: float, end: float, label: str | None = None) -> list[Sample]:
        """Samples sent at or after `start` and finished before `end`."""
        return [
            s
            for s in list(self.samples)
            if s.started >= start and s.ended <= end and (label is None or s.label == label)
        ]

    async def _main(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            workers = [
                self._worker(session, client) for client in self.clients for _ in range(client.concurrency)
            ]
            await asyncio.gather(*workers)

    async def _worker(self, session: aiohttp.ClientSession, client: Client) -> None:
        headers = {"Authorization": f"Bearer {client.key}", "Content-Type": "application/json"}
        rng = random.Random(id(client) ^ len(self.samples))
        while not self._stop.is_set():
            body, extra = client.make(rng) if client.make else (client.body, {})
            payload = orjson.dumps(body)
            stream = bool(body.get("stream"))
            started = time.monotonic()
            sample = Sample(client.label, started, started, 0)
            try:
                async with session.post(client.url, data=payload, headers={**headers, **extra}) as resp:
                    sample.status = resp.status
                    data = await resp.read()
                    if resp.status != 200:
                        try:
                            sample.code = str(orjson.loads(data)["error"].get("code") or "")
                        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
                            sample.code = "unparsed"
                    elif stream and b'"error"' in data:
                        sample.stream_error = True
                        for line in data.splitlines():
                            if line.startswith(b"data: {") and b'"error"' in line:
                                err = orjson.loads(line[6:]).get("error", {})
                                sample.code = str(err.get("code") or err.get("type") or "")
            except (TimeoutError, aiohttp.ClientError) as exc:
                sample.transport_error = type(exc).__name__
            sample.ended = time.monotonic()
            self.samples.append(sample)
            if sample.status == 0 or self.pause:
                await asyncio.sleep(self.pause or 0.05)  # a refused connection returns at once: no spin


def summary(samples: Iterable[Sample]) -> dict[str, int]:
    """Counts by outcome: '200', '200+sse_error', '503 limits_unavailable', 'transport ...'."""
    counts: dict[str, int] = {}
    for s in samples:
        if s.transport_error:
            key = f"transport {s.transport_error}"
        elif s.stream_error:
            key = f"{s.status}+sse_error {s.code}"
        elif s.status == 200:
            key = "200"
        else:
            key = f"{s.status} {s.code}"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))
