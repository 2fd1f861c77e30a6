"""A small streaming load generator for OpenAI-compatible engines (used by the simulator's tests and
benchmarks/sim_load.py): N concurrent streaming chat requests, per-request TTFT and inter-token latency.

Token counts come from `stream_options.continuous_usage_stats` (vLLM reports usage in every chunk), so
the per-request inter-token latency is exact even when a busy server sends several tokens per chunk.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field

import aiohttp
import orjson

from vllm_sim import text


@dataclass
class StreamResult:
    """Timings of one streamed request, in seconds of wall time."""

    ttft: float
    e2e: float
    completion_tokens: int
    prompt_tokens: int
    status: int = 200
    chunk_times: list[float] = field(default_factory=list)

    @property
    def itl(self) -> float:
        """Mean time between output tokens after the first (time per output token)."""
        if self.completion_tokens <= 1:
            return 0.0
        return (self.e2e - self.ttft) / (self.completion_tokens - 1)


def prompt_of(words: int, salt: int = 0) -> str:
    """A prompt of `words` common English words (one token each in the simulator's tokenizer)."""
    vocab = [w for w in text.VOCAB if w.strip().isalpha()]
    base = text.mix64(salt)
    return "".join(vocab[text.mix64(base + i) % len(vocab)] for i in range(words)).strip()


async def one_stream(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    messages: list[dict[str, str]],
    max_tokens: int,
    headers: dict[str, str],
) -> StreamResult:
    """Send one streaming chat request and time its chunks."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    start = time.perf_counter()
    ttft = -1.0
    tokens = 0
    prompt_tokens = 0
    times: list[float] = []
    async with session.post(url, data=orjson.dumps(body), headers=headers) as resp:
        if resp.status != 200:
            await resp.read()
            return StreamResult(-1.0, time.perf_counter() - start, 0, 0, resp.status)
        buf = b""
        async for data in resp.content.iter_any():
            now = time.perf_counter()
            buf += data
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if not event.startswith(b"data: ") or event == b"data: [DONE]":
                    continue
                chunk = orjson.loads(event[6:])
                usage = chunk.get("usage")
                if usage is None:
                    continue
                if usage["completion_tokens"] > tokens:
                    if tokens == 0:
                        ttft = now - start
                    tokens = usage["completion_tokens"]
                    times.append(now - start)
                prompt_tokens = usage["prompt_tokens"]
    return StreamResult(ttft, time.perf_counter() - start, tokens, prompt_tokens, 200, times)


async def run_streams(
    base_url: str,
    model: str,
    *,
    concurrency: int,
    prompt_words: int,
    max_tokens: int,
    api_key: str | None = None,
    distinct_prompts: bool = True,
    system_prompt: str | None = None,
    question: str = "",
    salt_base: int = 0,
) -> list[StreamResult]:
    """Start `concurrency` streams at once and wait for all of them.

    Each stream's user message is a prompt of about prompt_words words (distinct per stream unless
    distinct_prompts is false; salt_base shifts them, so successive runs do not hit the prefix cache)
    followed by `question`; system_prompt, when given, is a shared prefix.
    """
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        url = base_url + "/v1/chat/completions"
        tasks = []
        for i in range(concurrency):
            salt = salt_base + (i if distinct_prompts else 0)
            user = (prompt_of(prompt_words, salt) + " " + question).strip()
            messages = [{"role": "user", "content": user}]
            if system_prompt is not None:
                messages.insert(0, {"role": "system", "content": system_prompt})
            tasks.append(one_stream(session, url, model, messages, max_tokens, headers))
        return list(await asyncio.gather(*tasks))


def summarize(results: list[StreamResult]) -> dict[str, float]:
    """Medians of TTFT and ITL and the aggregate output token rate."""
    ok = [r for r in results if r.status == 200 and r.completion_tokens > 0]
    if not ok:
        return {"ok": 0}
    wall = max(r.e2e for r in ok)
    return {
        "ok": len(ok),
        "ttft_median_s": statistics.median(r.ttft for r in ok),
        "itl_median_s": statistics.median(r.itl for r in ok),
        "output_tokens_per_s": sum(r.completion_tokens for r in ok) / wall,
        "wall_s": wall,
    }
