"""One streamed request timed by token arrival, and the pre-flight check that stops a hopeless run."""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import orjson

from bench.stats import RequestResult
from bench.workload import WorkItem


class BenchError(RuntimeError):
    """The run cannot go on (unreachable target, refused key, unknown model); the message says why."""


def _headers(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def _error_message(body: bytes) -> str:
    try:
        err = orjson.loads(body).get("error")
        if isinstance(err, dict):
            return str(err.get("message") or err)
        return str(err or body[:200].decode(errors="replace"))
    except (orjson.JSONDecodeError, AttributeError):
        return body[:200].decode(errors="replace")


async def preflight(session: aiohttp.ClientSession, target: str, key: str | None, model: str | None) -> str:
    """Check the target answers, accepts the key and serves the model; returns the model to use."""
    url = f"{target}/v1/models"
    try:
        async with session.get(url, headers=_headers(key), timeout=aiohttp.ClientTimeout(total=10)) as resp:
            body = await resp.read()
            status = resp.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise BenchError(f"cannot reach {target}: {type(exc).__name__}: {exc}") from None
    if status in (401, 403):
        raise BenchError(f"{target} refused the API key (HTTP {status}): {_error_message(body)}")
    if status != 200:
        raise BenchError(f"GET {url} answered HTTP {status}: {_error_message(body)}")
    try:
        served = [m["id"] for m in orjson.loads(body)["data"]]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        raise BenchError(f"GET {url} did not answer an OpenAI model list") from None
    if model is None:
        if not served:
            raise BenchError(f"{target} serves no model")
        return str(served[0])
    if model not in served:
        raise BenchError(f"{target} does not serve {model!r}; it serves: {', '.join(served) or 'nothing'}")
    return model


def _text_of(chunk: dict[str, Any]) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    c = choices[0]
    delta = c.get("delta")
    if isinstance(delta, dict):
        return str(delta.get("content") or delta.get("reasoning_content") or "")
    return str(c.get("text") or "")


async def send(
    session: aiohttp.ClientSession,
    target: str,
    key: str | None,
    model: str,
    item: WorkItem,
    timeout_s: float,
    extra_body: dict[str, Any] | None = None,
) -> RequestResult:
    """Send one streamed request; times come from the arrival of each chunk that carries text."""
    body = item.body(model)
    if extra_body:
        body.update(extra_body)
    headers = _headers(key) | {"Content-Type": "application/json"}
    if item.session_id is not None:
        headers["X-Session-Id"] = item.session_id
    r = RequestResult(start=time.perf_counter())
    chunks = 0
    try:
        async with session.post(
            target + item.path,
            data=orjson.dumps(body),
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as resp:
            if resp.status != 200:
                r.error = f"http_{resp.status}"
                await resp.read()
                return r
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = orjson.loads(data)
                if "error" in chunk:
                    r.error = "stream_error"
                    return r
                if _text_of(chunk):
                    now = time.perf_counter()
                    if r.first_token is None:
                        r.first_token = now
                    r.token_times.append(now)
                    chunks += 1
                usage = chunk.get("usage")
                if usage:
                    r.output_tokens = int(usage.get("completion_tokens") or 0)
                    r.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        r.ok = True
        if not r.output_tokens:
            r.output_tokens = chunks
    except TimeoutError:
        r.error = "timeout"
    except aiohttp.ClientConnectionError:
        r.error = "connection"
    except (aiohttp.ClientError, orjson.JSONDecodeError, ValueError):
        r.error = "protocol"
    finally:
        r.end = time.perf_counter()
    return r
