"""Shadow traffic: a share of an alias's live requests mirrored to a candidate version after the
primary has answered, and each pair stored and scored.

The mirror never touches the client's request: it starts only once the primary's answer has been
sent in full (the proxy collects the primary's text while relaying it), runs as a background task
on the same event loop, and its failures end there. It is never admitted by the limiter (so never
counted against the tenant's quota or rate limits) and writes no request-log row: the ShadowPair is
its record. It is skipped, and counted by reason, when this process already has the config's
`max_inflight` mirrors out, when no candidate endpoint is healthy, or when every one is as busy as
batch traffic may make it (the pool's `batch_max_fraction` of its capacity), so mirrors never
crowd out real traffic on a candidate that also serves a canary. The candidate is asked for a whole
(non-streamed) answer, whatever the client asked for: the text is what is compared.

Pairs are written in batches from a thread (the request log's writer, with its spool) and scored
there with the evaluation metrics: exact match, first divergence (in whitespace-separated words: the
primary's token ids are not asked for) and chrF, plus the rest of `score_sample`'s figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from dataclasses import dataclass
from typing import Any

import orjson

from models_registry.evaluation.metrics import SideOutput, score_sample
from routing.models import ShadowPair
from routing.proxy import metrics as m
from routing.proxy.config import Endpoint, Shadow
from routing.proxy.health import EndpointState
from routing.proxy.requestlog import RequestLogWriter
from routing.proxy.upstream import UpstreamPool, split_base_url

log = logging.getLogger(__name__)

PATHS = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}
# Request fields that shape only how the answer is delivered, not what it says.
DELIVERY_FIELDS = ("stream", "stream_options")
ERROR_CHARS = 500


@dataclass(slots=True)
class MirrorJob:
    """One primary request, answered, to be mirrored to `shadow`'s candidate."""

    shadow: Shadow
    request_id: str
    kind: str
    tenant_id: int | None
    body: dict[str, Any]
    primary_version_id: int | None
    primary_output: str
    primary_latency_ms: float
    # In-flight requests per candidate endpoint above which it counts as saturated for mirrors.
    room_per_endpoint: float
    connect_timeout_s: float = 2.0


def output_text(data: bytes) -> str | None:
    """The first choice's text of a whole OpenAI chat or completion answer (None if there is none)."""
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    choices = parsed.get("choices") if isinstance(parsed, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    message = choice.get("message")
    text = message.get("content") if isinstance(message, dict) else None
    if not isinstance(text, str):
        text = choice.get("text")
    return text if isinstance(text, str) else None


class ShadowMirror:
    """Sends mirrors for one proxy process; `submit` decides at once, the call runs in the background."""

    def __init__(
        self, upstream: UpstreamPool, states: dict[str, EndpointState], writer: RequestLogWriter | None
    ) -> None:
        self.upstream = upstream
        self.states = states
        self.writer = writer
        self.inflight: dict[int, int] = {}  # by ShadowConfig id
        self.tasks: set[asyncio.Task[None]] = set()

    def _skip(self, alias: str, reason: str) -> None:
        m.SHADOW_SKIPPED.labels(alias, reason).inc()

    def pick(self, job: MirrorJob) -> Endpoint | None:
        """The candidate endpoint for the mirror, or None (and the skip counted with its reason)."""
        shadow = job.shadow
        if self.inflight.get(shadow.config_id, 0) >= shadow.max_inflight:
            self._skip(shadow.alias, "max_inflight")
            return None
        if not shadow.endpoints:
            self._skip(shadow.alias, "no_endpoint")
            return None
        # Only endpoints whose circuit breaker is closed: a mirror is never the probe of an ejected one.
        healthy = [
            (state, ep)
            for ep in shadow.endpoints
            if (state := self.states.setdefault(ep.id, EndpointState(ep.id))).open_until == 0.0
        ]
        if not healthy:
            self._skip(shadow.alias, "unavailable")
            return None
        state, ep = min(healthy, key=lambda pair: pair[0].inflight)
        if state.inflight >= job.room_per_endpoint:
            self._skip(shadow.alias, "saturated")
            return None
        return ep

    def submit(self, job: MirrorJob) -> bool:
        """Start mirroring `job` unless it must be skipped; True when a mirror was started."""
        ep = self.pick(job)
        if ep is None:
            return False
        config = job.shadow.config_id
        self.inflight[config] = self.inflight.get(config, 0) + 1
        state = self.states[ep.id]
        state.inflight += 1  # the candidate's load, as the scorers and the saturation check see it
        task = asyncio.get_running_loop().create_task(self._run(job, ep, state))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return True

    async def _run(self, job: MirrorJob, ep: Endpoint, state: EndpointState) -> None:
        shadow = job.shadow
        started = time.perf_counter()
        status: int | None = None
        error = ""
        text = ""
        try:
            status, data = await self._call(job, ep)
            if status == 200:
                found = output_text(data)
                if found is None:
                    error = "the answer has no choice text"
                text = found or ""
            else:
                error = data[:ERROR_CHARS].decode("utf-8", "replace")
            outcome = "ok" if status == 200 and not error else "error"
        except TimeoutError:
            outcome = "timeout"
            error = f"no whole answer within {shadow.timeout_s:g} s"
        except OSError as exc:  # connect refused, connection dropped (UpstreamError is one)
            outcome = "error"
            error = f"{type(exc).__name__}: {exc}"[:ERROR_CHARS]
        except asyncio.CancelledError:
            raise  # the proxy is shutting down: nothing to store
        except Exception as exc:  # a mirror must never take anything else down with it
            log.exception("proxy: shadow mirror failed")
            outcome = "error"
            error = f"{type(exc).__name__}: {exc}"[:ERROR_CHARS]
        finally:
            state.inflight -= 1
            self.inflight[shadow.config_id] -= 1
        elapsed = time.perf_counter() - started
        version = shadow.version_label or str(shadow.version_id)
        m.SHADOW_MIRRORS.labels(shadow.alias, version, outcome).inc()
        if outcome == "ok":
            m.SHADOW_LATENCY.labels(shadow.alias, version).observe(elapsed)
        if self.writer is None:
            return
        self.writer.add(
            {
                "created_at": dt.datetime.now(dt.UTC),
                "request_id": job.request_id,
                "alias": shadow.alias[:100],
                "tenant_id": job.tenant_id,
                "endpoint_kind": job.kind,
                "primary_version_id": job.primary_version_id,
                "candidate_version_id": shadow.version_id,
                "request": job.body,
                "primary_output": job.primary_output,
                "candidate_output": text,
                "primary_latency_ms": job.primary_latency_ms,
                "candidate_latency_ms": elapsed * 1000 if status is not None else None,
                "candidate_status": status,
                "candidate_error": error,
            }
        )

    async def _call(self, job: MirrorJob, ep: Endpoint) -> tuple[int, bytes]:
        body = {k: v for k, v in job.body.items() if k not in DELIVERY_FIELDS}
        body["model"] = ep.served_model_name
        host, port = split_base_url(ep.base_url)
        extra = b"Authorization: Bearer " + ep.api_key.encode() + b"\r\n" if ep.api_key else b""
        async with asyncio.timeout(job.shadow.timeout_s):
            resp = await self.upstream.post(
                host, port, PATHS[job.kind], orjson.dumps(body), extra, job.connect_timeout_s
            )
            try:
                return resp.status, await resp.read()
            finally:
                resp.release()  # closes the connection unless the answer was read whole

    async def close(self) -> None:
        """Cancel the mirrors still out (the proxy is stopping; they are best effort)."""
        for task in list(self.tasks):
            task.cancel()
        for task in list(self.tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


# ---- storing pairs (the writer's thread) ----------------------------------------------------------

PAIR_FIELDS = (
    "created_at",
    "request_id",
    "alias",
    "tenant_id",
    "endpoint_kind",
    "primary_version_id",
    "candidate_version_id",
    "request",
    "primary_output",
    "candidate_output",
    "primary_latency_ms",
    "candidate_latency_ms",
    "candidate_status",
    "candidate_error",
)


def score_pair(primary: str, candidate: str) -> dict[str, Any]:
    """The evaluation metrics of one pair, the primary as the reference (words as tokens)."""
    return score_sample(SideOutput(primary, primary.split()), SideOutput(candidate, candidate.split()))


def _clean(value: Any) -> Any:
    # PostgreSQL text and jsonb cannot hold NUL: one in a prompt must not fail the batch forever.
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict | list):
        raw = orjson.dumps(value)
        if b"\\u0000" in raw:
            return orjson.loads(raw.replace(b"\\u0000", b"\\ufffd"))
    return value


def write_pairs(rows: list[dict[str, Any]]) -> None:
    """Score and insert mirrored pairs (sync, on the writer's thread; raises on a database error)."""
    pairs = []
    for row in rows:
        fields = {name: _clean(row[name]) for name in PAIR_FIELDS if name in row}
        if row.get("candidate_status") == 200 and not row.get("candidate_error"):
            scores = score_pair(fields.get("primary_output", ""), fields.get("candidate_output", ""))
            fields.update(
                exact_match=scores["exact_match"],
                first_divergence=scores["first_divergence"],
                chrf=scores["chrf"],
                scores=scores,
            )
        pairs.append(ShadowPair(**fields))
    ShadowPair.objects.bulk_create(pairs)


def pair_writer(spool_dir: Any) -> RequestLogWriter:
    """The batched writer of ShadowPair rows (its own spool directory, beside the request log's)."""
    return RequestLogWriter(spool_dir, writer=write_pairs, label="shadow pairs", spooled_counter=None)
