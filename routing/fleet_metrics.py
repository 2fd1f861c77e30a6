"""Prometheus exposition of the fleet: every host's GPUs, every engine's scraped state, tenants' budgets.

The agents already publish all of it (nodes/agent/supervisor.py): a live JSON record per GPU and per
engine in Redis with a short TTL (`nodes.lifecycle.live_gpu_key` / `live_deployment_key`), and the
proxy's limiter keeps each tenant's tokens of the day. A render reads the inventory from the database
(hosts, GPUs, deployments, tenants with a budget: four queries), every live record in one MGET, and
builds the families: at 1,000 hosts x 8 GPUs and 5,000 engines that is 142,400 samples, 18.7 MB of text
and ~250 ms of one core, too slow to do inside every scrape (docs/benchmarks.md "Fleet exposition").

So the text is rendered at most once per FLEET_METRICS_MAX_AGE_SECONDS (5 s) for the whole control plane
and served from there, the way kube-state-metrics serves from its stores: one gzip'd body (1 MB) in
Redis, stamped with the moment its inventory and live records were read. A scrape serves that body
only while it is younger than FLEET_METRICS_MAX_AGE_SECONDS; otherwise it renders (or waits for the
render another process has in flight) before it answers. While scrapes keep coming, the Celery worker
renders ahead of the bound (beat's `routing.refresh_fleet_metrics`, every second; one render at a time
for the whole control plane, a Redis lease), so a scrape only copies the stored body and the web
processes keep their CPU for the agents' syncs. The contract: a number is never older than
FLEET_METRICS_MAX_AGE_SECONDS plus the agent's tick when it is served; an expired record (a dead
agent, a stopped engine) is absent, not stale, from the first render after it expired, and the `*_up`
gauges say so; and
`inferchain_exposition_read_timestamp_seconds` is the read's time, so `time() - it` is the exact age.
FLEET_METRICS_MAX_AGE_SECONDS=0 renders on every scrape, as before.

Labels are bounded by the inventory: one series per GPU, per deployment, per tenant with a budget.
No label carries a request, a prompt or a free-form value; `METRICS` below is the documented list
(docs/monitoring.md is generated from the same names and the test checks both).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gzip
import logging
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple
from uuid import uuid4

import orjson
from django.conf import settings
from django.http import HttpRequest, HttpResponse

from console.models import Quota
from core.metrics_access import REFUSAL, metrics_allowed
from core.redis_client import get_redis, key
from nodes.choices import DeploymentState, DesiredState
from nodes.lifecycle import live_deployment_key, live_gpu_key
from nodes.models import Deployment, Gpu, Host
from routing.proxy.limits import budget_key, tenant_scope

log = logging.getLogger(__name__)

GPU_LABELS = ("host", "gpu", "uuid")
DEPLOYMENT_LABELS = ("deployment", "alias", "model_version", "host")
QUANTILES = ("0.5", "0.95")


@dataclass(frozen=True)
class MetricDoc:
    name: str
    kind: str  # "gauge" or "counter" (exposed with a `_total` sample)
    labels: tuple[str, ...]
    help: str


METRICS: tuple[MetricDoc, ...] = (
    MetricDoc(
        "inferchain_host_up",
        "gauge",
        ("host",),
        "1 when the host's agent sent a heartbeat within NODE_UNREACHABLE_SECONDS, else 0.",
    ),
    MetricDoc(
        "inferchain_gpu_info",
        "gauge",
        (*GPU_LABELS, "name", "simulated"),
        'One series per registered GPU, value 1; simulated is "true" for GPUs modelled by the '
        "simulator (no NVML).",
    ),
    MetricDoc(
        "inferchain_gpu_up",
        "gauge",
        GPU_LABELS,
        "1 when the agent's live sample of this GPU is current (within NODE_LIVE_TTL_SECONDS), else 0.",
    ),
    MetricDoc(
        "inferchain_gpu_memory_used_bytes",
        "gauge",
        GPU_LABELS,
        "GPU memory in use, in bytes.",
    ),
    MetricDoc(
        "inferchain_gpu_memory_total_bytes",
        "gauge",
        GPU_LABELS,
        "GPU memory in all, in bytes.",
    ),
    MetricDoc(
        "inferchain_gpu_utilization_ratio",
        "gauge",
        GPU_LABELS,
        "GPU utilization over the last sample period, 0 to 1.",
    ),
    MetricDoc(
        "inferchain_gpu_temperature_celsius",
        "gauge",
        GPU_LABELS,
        "GPU temperature in degrees Celsius.",
    ),
    MetricDoc(
        "inferchain_gpu_power_watts",
        "gauge",
        GPU_LABELS,
        "GPU power draw in watts.",
    ),
    MetricDoc(
        "inferchain_deployment_up",
        "gauge",
        (*DEPLOYMENT_LABELS, "engine"),
        "1 when the deployment is ready and its agent's live record is current, else 0; every "
        "deployment that should be running or is not stopped.",
    ),
    MetricDoc(
        "inferchain_deployment_desired_running",
        "gauge",
        DEPLOYMENT_LABELS,
        "1 when the deployment is meant to run (desired state running), else 0.",
    ),
    MetricDoc(
        "inferchain_deployment_state",
        "gauge",
        (*DEPLOYMENT_LABELS, "state"),
        "1 for the deployment's current lifecycle state (one series per deployment).",
    ),
    MetricDoc(
        "inferchain_deployment_restarts",
        "counter",
        DEPLOYMENT_LABELS,
        "Restarts of the deployment's engine after a crash or hang, over its lifetime.",
    ),
    MetricDoc(
        "inferchain_engine_requests_running",
        "gauge",
        DEPLOYMENT_LABELS,
        "Requests the engine is running now (vllm:num_requests_running).",
    ),
    MetricDoc(
        "inferchain_engine_requests_waiting",
        "gauge",
        DEPLOYMENT_LABELS,
        "Requests queued in the engine (vllm:num_requests_waiting).",
    ),
    MetricDoc(
        "inferchain_engine_kv_cache_usage_ratio",
        "gauge",
        DEPLOYMENT_LABELS,
        "KV cache in use, 0 to 1 (vllm:kv_cache_usage_perc).",
    ),
    MetricDoc(
        "inferchain_engine_kv_cache_capacity_tokens",
        "gauge",
        DEPLOYMENT_LABELS,
        "Tokens the engine's KV cache holds in all.",
    ),
    MetricDoc(
        "inferchain_engine_prompt_tokens",
        "counter",
        DEPLOYMENT_LABELS,
        "Prompt tokens the engine processed since it started.",
    ),
    MetricDoc(
        "inferchain_engine_generation_tokens",
        "counter",
        DEPLOYMENT_LABELS,
        "Tokens the engine generated since it started.",
    ),
    MetricDoc(
        "inferchain_engine_prefix_cache_queries",
        "counter",
        DEPLOYMENT_LABELS,
        "Prompt tokens looked up in the prefix cache since the engine started.",
    ),
    MetricDoc(
        "inferchain_engine_prefix_cache_hits",
        "counter",
        DEPLOYMENT_LABELS,
        "Prompt tokens found in the prefix cache since the engine started; hit rate = rate(hits) "
        "/ rate(queries).",
    ),
    MetricDoc(
        "inferchain_engine_generation_tokens_per_second",
        "gauge",
        DEPLOYMENT_LABELS,
        "Generated tokens per second over the agent's last 10 s.",
    ),
    MetricDoc(
        "inferchain_engine_ttft_seconds",
        "gauge",
        (*DEPLOYMENT_LABELS, "quantile"),
        "Time to first token at the engine, quantile 0.5 or 0.95 over the agent's last 10 s "
        "(engine lifetime when idle).",
    ),
    MetricDoc(
        "inferchain_engine_itl_seconds",
        "gauge",
        (*DEPLOYMENT_LABELS, "quantile"),
        "Inter-token latency at the engine, quantile 0.5 or 0.95 over the agent's last 10 s "
        "(engine lifetime when idle).",
    ),
    MetricDoc(
        "inferchain_tenant_daily_token_budget",
        "gauge",
        ("tenant",),
        "The tenant's daily token budget (tenants with one).",
    ),
    MetricDoc(
        "inferchain_tenant_daily_tokens_used",
        "gauge",
        ("tenant",),
        "Tokens the tenant used (or holds reserved) today, UTC; resets at 00:00 UTC.",
    ),
    MetricDoc(
        "inferchain_exposition_read_timestamp_seconds",
        "gauge",
        (),
        "When the inventory and live records behind this exposition were read, Unix time; time() minus "
        "it is how old its numbers are (at most FLEET_METRICS_MAX_AGE_SECONDS).",
    ),
)
BY_NAME = {m.name: m for m in METRICS}


class _Dep(NamedTuple):
    pk: int
    name: str
    served_model_name: str
    engine: str
    state: str
    desired_state: str
    restarts_total: int
    host: str
    model: str
    revision: str
    role: str
    model_version_id: int


@dataclass
class FleetState:
    """What one scrape reads: the inventory and the live records, keyed as the families need them."""

    hosts: list[tuple[str, bool]]
    gpus: list[tuple[tuple[str, str, str], str, bool, dict[str, Any] | None]]
    deployments: list[tuple[tuple[str, str, str, str], Any, dict[str, Any] | None]]
    tenants: list[tuple[str, int, int]]
    # When the inventory and the live records were read (epoch seconds); None for a state made by hand.
    read_at: float | None = None


def read_state(now: float | None = None) -> FleetState:
    """The fleet as the database and Redis have it now (never raises for Redis: records are absent)."""
    now = time.time() if now is None else now
    unreachable = settings.NODE_UNREACHABLE_SECONDS
    hosts = [
        (name, beat is not None and now - beat.timestamp() <= unreachable)
        for name, beat in Host.objects.order_by("name").values_list("name", "last_heartbeat")
    ]
    gpu_rows = list(
        Gpu.objects.order_by("host__name", "index").values_list(
            "host__name", "index", "uuid", "name", "simulated"
        )
    )
    deployments = [
        _Dep(*row)
        for row in Deployment.objects.exclude(
            state=DeploymentState.STOPPED, desired_state=DesiredState.STOPPED
        )
        .order_by("name")
        .values_list(
            "pk",
            "name",
            "served_model_name",
            "engine",
            "state",
            "desired_state",
            "restarts_total",
            "host__name",
            "model_version__model__name",
            "model_version__revision",
            "role",
            "model_version_id",
        )
    ]
    budgets = list(
        Quota.objects.filter(tenant__isnull=False, daily_token_budget__isnull=False)
        .order_by("tenant__name")
        .values_list("tenant_id", "tenant__name", "daily_token_budget")
    )
    raws = read_live_values(
        [(h, i) for h, i, *_ in gpu_rows], [d.pk for d in deployments], [tid for tid, _, _ in budgets], now
    )
    n_gpus, n_deps = len(gpu_rows), len(deployments)
    gpus = [
        ((h, str(i), uuid), name, simulated, live_json(raws[k]))
        for k, (h, i, uuid, name, simulated) in enumerate(gpu_rows)
    ]
    deps = [
        (
            (d.name, d.served_model_name, f"{d.model}@{d.revision}", d.host),
            d,
            live_json(raws[n_gpus + k]),
        )
        for k, d in enumerate(deployments)
    ]
    tenants = [
        (name, int(budget or 0), live_int(raws[n_gpus + n_deps + k]))
        for k, (_tid, name, budget) in enumerate(budgets)
    ]
    return FleetState(hosts=hosts, gpus=gpus, deployments=deps, tenants=tenants, read_at=now)


def read_live_values(
    gpus: list[tuple[str, int]], deployment_ids: list[int], tenant_ids: list[int], now: float
) -> list[Any]:
    """The raw live records of these GPUs (host, index) and deployments, then these tenants' tokens of
    the day at `now`, in that order, in one MGET (also the alert rules' read, alerts/fleet.py). Redis
    down: every value absent (None), so the *_up gauges read 0."""
    day = dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y%m%d")
    # 13,000 keys at 1,000 hosts: formatted from the shared prefix (what live_gpu_key and
    # live_deployment_key write) rather than through key()'s settings lookup and join for each.
    gpu_prefix = live_gpu_key("", 0).removesuffix(":0")
    dep_prefix = live_deployment_key(0).removesuffix("0")
    keys = (
        [f"{gpu_prefix}{h}:{i}" for h, i in gpus]
        + [f"{dep_prefix}{pk}" for pk in deployment_ids]
        + [budget_key(tenant_scope(tid), day) for tid in tenant_ids]
    )
    raws: list[Any] = [None] * len(keys)
    if keys:
        with contextlib.suppress(Exception):
            raws = get_redis().mget(keys)
    return raws


def live_json(raw: Any) -> dict[str, Any] | None:
    """A live record as read from Redis: None for an absent, unreadable or non-object value (also the
    alert rules' read, alerts/fleet.py)."""
    if not raw:
        return None
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def live_int(raw: Any) -> int:
    """A counter as read from Redis (a tenant's tokens of the day): 0 when absent or unreadable."""
    try:
        return int(float(raw)) if raw else 0
    except (TypeError, ValueError):
        return 0


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# The exposition is written here, not through prometheus_client's generate_latest: that one formats
# every sample's labels afresh (about 25 us a sample), and a fleet of 100 hosts x 8 GPUs and 400
# engines has 12,900 samples. Here each GPU's and each deployment's label string is escaped once and
# shared by all its series, each family's header is made once at import, and each sample is one
# concatenation appended to its family's list (docs/benchmarks.md "Fleet exposition"). The text is
# what generate_latest writes for the same families: a counter's family is named by its `_total`
# sample, values are Python's float repr (`+Inf`, `-Inf`, `NaN` spelled Prometheus' way), label
# values escape backslash, double quote and newline; tests/nodes/test_fleet_metrics.py reads it back
# with prometheus_client's parser.
_SAMPLE = {m.name: m.name + "_total" if m.kind == "counter" else m.name for m in METRICS}


def _header(m: MetricDoc) -> str:
    doc = m.help.replace("\\", "\\\\").replace("\n", "\\n")
    return f"# HELP {_SAMPLE[m.name]} {doc}\n# TYPE {_SAMPLE[m.name]} {m.kind}\n"


_HEADER = {m.name: _header(m) for m in METRICS}


def _float(raw: Any) -> float | None:
    """A live record's number; None for a missing or non-numeric value."""
    kind = type(raw)
    if kind is float:
        return raw
    if kind is int:
        return float(raw)
    if raw is None or kind is bool:
        return None
    try:
        return float(raw)
    except (TypeError, ValueError):
        return None


def _value(raw: Any, scale: float = 1.0) -> str | None:
    """A live record's number (times `scale`) as exposition text; None when there is none."""
    value = _float(raw)
    if value is None:
        return None
    return _fmt(value * scale if scale != 1.0 else value)


def _fmt(value: float) -> str:
    if value - value == 0.0:  # finite: the common case, one subtraction
        return repr(value)
    if value != value:
        return "NaN"
    return "+Inf" if value > 0 else "-Inf"


def _escape(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return value


_GPU_VALUES = (
    ("inferchain_gpu_memory_used_bytes", "memory_used_bytes"),
    ("inferchain_gpu_memory_total_bytes", "memory_total_bytes"),
    ("inferchain_gpu_utilization_ratio", "utilization_pct"),  # a percentage: scaled to 0-1
    ("inferchain_gpu_temperature_celsius", "temperature_c"),
    ("inferchain_gpu_power_watts", "power_watts"),
)
_ENGINE_VALUES = (
    ("inferchain_engine_requests_running", "num_requests_running"),
    ("inferchain_engine_requests_waiting", "num_requests_waiting"),
    ("inferchain_engine_kv_cache_usage_ratio", "kv_cache_usage_perc"),
    ("inferchain_engine_kv_cache_capacity_tokens", "kv_cache_total_tokens"),
    ("inferchain_engine_prompt_tokens", "prompt_tokens_total"),
    ("inferchain_engine_generation_tokens", "generation_tokens_total"),
    ("inferchain_engine_prefix_cache_queries", "prefix_cache_queries_total"),
    ("inferchain_engine_prefix_cache_hits", "prefix_cache_hits_total"),
    ("inferchain_engine_generation_tokens_per_second", "tokens_per_s"),
    ("inferchain_engine_ttft_seconds", "ttft_p50_s", "0.5"),
    ("inferchain_engine_ttft_seconds", "ttft_p95_s", "0.95"),
    ("inferchain_engine_itl_seconds", "itl_p50_s", "0.5"),
    ("inferchain_engine_itl_seconds", "itl_p95_s", "0.95"),
)


def render_state(state: FleetState) -> bytes:
    """The text exposition (format 0.0.4) of one scrape's state, families in METRICS' order."""
    lines: dict[str, list[str]] = {m.name: [] for m in METRICS}

    def sink(name: str) -> tuple[Any, str]:
        return lines[name].append, _SAMPLE[name] + "{"

    host_up, host_up_s = sink("inferchain_host_up")
    for host, up in state.hosts:
        host_up(f'{host_up_s}host="{_escape(host)}"}} {1.0 if up else 0.0}\n')

    info, info_s = sink("inferchain_gpu_info")
    gpu_up, gpu_up_s = sink("inferchain_gpu_up")
    gpu_values = [
        (*sink(metric), field, 0.01 if metric == "inferchain_gpu_utilization_ratio" else 1.0)
        for metric, field in _GPU_VALUES
    ]
    for (host, index, uuid), name, simulated, live in state.gpus:
        labels = f'host="{_escape(host)}",gpu="{_escape(index)}",uuid="{_escape(uuid)}"'
        sim = "true" if simulated else "false"
        info(f'{info_s}{labels},name="{_escape(name)}",simulated="{sim}"}} 1.0\n')
        gpu_up(f"{gpu_up_s}{labels}}} {0.0 if live is None else 1.0}\n")
        if live is None:
            continue
        for append, sample, field, scale in gpu_values:
            raw: Any = live.get(field)
            # The agent writes finite floats and ints: format them inline, anything else by _value.
            kind = type(raw)
            if kind is int or (kind is float and raw - raw == 0.0):
                text: str | None = repr(float(raw) * scale)
            else:
                text = _value(raw, scale)
            if text is not None:
                append(sample + labels + "} " + text + "\n")

    dep_up, dep_up_s = sink("inferchain_deployment_up")
    desired, desired_s = sink("inferchain_deployment_desired_running")
    dep_state, dep_state_s = sink("inferchain_deployment_state")
    restarts, restarts_s = sink("inferchain_deployment_restarts")
    engine_values = [
        (*sink(spec[0]), spec[1], f',quantile="{spec[2]}"}} ' if len(spec) == 3 else "} ")
        for spec in _ENGINE_VALUES
    ]
    for (name, alias, version, host), dep, live in state.deployments:
        labels = (
            f'deployment="{_escape(name)}",alias="{_escape(alias)}",'
            f'model_version="{_escape(version)}",host="{_escape(host)}"'
        )
        ready = dep.state == DeploymentState.READY and live is not None
        dep_up(f'{dep_up_s}{labels},engine="{_escape(dep.engine)}"}} {1.0 if ready else 0.0}\n')
        running = 1.0 if dep.desired_state == DesiredState.RUNNING else 0.0
        desired(f"{desired_s}{labels}}} {running}\n")
        dep_state(f'{dep_state_s}{labels},state="{_escape(dep.state)}"}} 1.0\n')
        restarts(f"{restarts_s}{labels}}} {float(dep.restarts_total)!r}\n")
        if live is None or not live.get("has_metrics", True):
            continue  # no record, or an engine without /metrics (llama.cpp): nothing was scraped
        for append, sample, field, tail in engine_values:
            raw = live.get(field)
            kind = type(raw)
            text = repr(float(raw)) if kind is int or (kind is float and raw - raw == 0.0) else _value(raw)
            if text is not None:
                append(sample + labels + tail + text + "\n")

    budget, budget_s = sink("inferchain_tenant_daily_token_budget")
    used, used_s = sink("inferchain_tenant_daily_tokens_used")
    for tenant, limit, spent in state.tenants:
        labels = f'tenant="{_escape(tenant)}"}} '
        budget(f"{budget_s}{labels}{float(limit)!r}\n")
        used(f"{used_s}{labels}{float(spent)!r}\n")

    if state.read_at is not None:
        stamp, stamp_s = sink("inferchain_exposition_read_timestamp_seconds")
        stamp(f"{stamp_s[:-1]} {float(state.read_at)!r}\n")

    out: list[str] = []
    for m in METRICS:
        out.append(_HEADER[m.name])
        out.extend(lines[m.name])
    return "".join(out).encode()


def render(state: FleetState | None = None) -> bytes:
    """The text exposition of the fleet read now (or of `state`): no cache, the whole cost."""
    return render_state(read_state() if state is None else state)


# --- the rendered body, shared by every web process ----------------------------------------------------

# Stored as MAGIC, the read time (a big-endian double) and the gzip'd text, in one key: one GET serves
# a scrape, and a GETRANGE of the first 12 bytes tells a waiting scrape or the refresher its age.
_MAGIC = b"ICX1"
_STAMP = struct.Struct("!d")
_HEADER_BYTES = len(_MAGIC) + _STAMP.size
# The render lease: one render at a time for the whole control plane. Longer than any render; a holder
# that died only delays refresh-ahead, since a scrape that finds no fresh body renders after WAIT_SECONDS.
LEASE_SECONDS = 30
# How long a scrape that finds no fresh body waits for the render in flight elsewhere before it renders
# itself: under Prometheus' default scrape_timeout (10 s), and well over a render (~0.3 s at 1,000 hosts).
WAIT_SECONDS = 5.0
# Refresh-ahead goes on while the last scrape is younger than this (any scrape interval up to 2 min),
# then the threads stop and an idle control plane renders nothing.
SCRAPED_WINDOW_SECONDS = 120
# gzip level 1: 18.7 MB to 1.0 MB in ~50 ms; level 6 halves the size again for twice the time.
GZIP_LEVEL = 1


@dataclass(frozen=True)
class Exposition:
    """One render: when its inventory and live records were read, and its text gzip'd."""

    read_at: float
    gzipped: bytes

    def text(self) -> bytes:
        """The plain text, for a scraper that does not accept gzip (decompressed once per render)."""
        global _plain
        memo = _plain
        if memo is not None and memo[0] == self.read_at:
            return memo[1]
        text = gzip.decompress(self.gzipped)
        _plain = (self.read_at, text)
        return text


_plain: tuple[float, bytes] | None = None


def _body_key() -> str:
    return key("fleetmetrics", "body")


def _lease_key() -> str:
    return key("fleetmetrics", "lease")


def _scraped_key() -> str:
    return key("fleetmetrics", "scraped")


def render_exposition(now: float | None = None) -> Exposition:
    """Read the fleet now and render it (the ~250 ms at 1,000 hosts that a scrape must not wait for)."""
    global _plain
    state = read_state(now)
    assert state.read_at is not None
    text = render_state(state)
    _plain = (state.read_at, text)  # a plain scrape of this render needs no decompression
    return Exposition(state.read_at, gzip.compress(text, GZIP_LEVEL, mtime=0))


def _stored_read_at(redis: Any) -> float | None:
    head = redis.getrange(_body_key(), 0, _HEADER_BYTES - 1)
    if len(head) != _HEADER_BYTES or not head.startswith(_MAGIC):
        return None
    return float(_STAMP.unpack_from(head, len(_MAGIC))[0])


def _load(redis: Any, now: float, max_age: float) -> Exposition | None:
    """The stored body when it was read at most `max_age` seconds before `now`."""
    raw = redis.get(_body_key())
    if not raw or not raw.startswith(_MAGIC):
        return None
    read_at = float(_STAMP.unpack_from(raw, len(_MAGIC))[0])
    if now - read_at > max_age:
        return None
    return Exposition(read_at, raw[_HEADER_BYTES:])


def _store(redis: Any, exposition: Exposition, max_age: float) -> None:
    # Kept a little past its bound only: nothing older is ever served, and an idle fleet keeps no 1 MB.
    redis.set(
        _body_key(),
        _MAGIC + _STAMP.pack(exposition.read_at) + exposition.gzipped,
        px=int((max_age + 1.0) * 1000),
    )


def _render_under_lease(redis: Any, max_age: float) -> Exposition | None:
    """Render and store, if no other process is rendering now (else None)."""
    token = uuid4().hex
    if not redis.set(_lease_key(), token, nx=True, ex=LEASE_SECONDS):
        return None
    try:
        exposition = render_exposition()
        _store(redis, exposition, max_age)
        return exposition
    finally:
        # Only our own lease: one that outlived LEASE_SECONDS must not free the next holder's.
        if redis.get(_lease_key()) == token.encode():
            redis.delete(_lease_key())


def refresh_once(max_age: float | None = None) -> Exposition | None:
    """One refresh-ahead step: render and store if no other process holds the lease (else None)."""
    max_age = settings.FLEET_METRICS_MAX_AGE_SECONDS if max_age is None else max_age
    return _render_under_lease(get_redis(), max_age)


def current_exposition() -> Exposition:
    """What a scrape serves: the stored render while it is younger than FLEET_METRICS_MAX_AGE_SECONDS;
    else a render of its own, or the one another process has in flight (waited for, not older numbers).
    Redis down: a render of its own (every live record then reads absent)."""
    max_age = settings.FLEET_METRICS_MAX_AGE_SECONDS
    if max_age <= 0:
        return render_exposition()
    try:
        redis = get_redis()
        redis.set(_scraped_key(), b"1", ex=SCRAPED_WINDOW_SECONDS)
        deadline = time.monotonic() + WAIT_SECONDS
        while True:
            found = _load(redis, time.time(), max_age)
            if found is not None:
                return found
            rendered = _render_under_lease(redis, max_age)
            if rendered is not None:
                return rendered
            if time.monotonic() >= deadline:
                break
            # Another process is rendering: poll its stamp (12 bytes), not the whole body.
            while time.monotonic() < deadline:
                time.sleep(0.05)
                read_at = _stored_read_at(redis)
                if read_at is not None and time.time() - read_at <= max_age:
                    break
    except Exception as exc:  # Redis trouble must not cost the scrape
        log.warning("fleet exposition: serving a render of this scrape's own (%s)", exc)
    return render_exposition()


# --- refresh-ahead ---------------------------------------------------------------------------------

# The render's last duration in this process: refresh-ahead starts early enough to land before the bound.
_last_render_seconds = 0.0


def _next_due(read_at: float | None, max_age: float) -> float:
    """When the next render should start: early enough that it is stored before the current body passes
    max_age even if it runs twice as slow as the last one, but never more often than every max_age / 2."""
    if read_at is None:
        return 0.0
    lead = max(0.5, 2 * _last_render_seconds)
    return read_at + max(max_age / 2, max_age - lead)


def refresh_if_due(now: float | None = None) -> bool:
    """One refresh-ahead step (the beat task `routing.refresh_fleet_metrics`, every second, in the
    Celery worker): render and store when someone scraped within SCRAPED_WINDOW_SECONDS and the stored
    render is due for renewal, unless another process holds the lease. True when it rendered.

    In the worker, not in the web processes: a render holds a Python process for a quarter of a second
    at 1,000 hosts, and in a web process that stalls the agents' syncs it serves (1,000 hosts at 2 s:
    268 instead of 340 syncs a second answered, docs/benchmarks.md). Without a worker a scrape that
    finds the stored render past its bound renders itself, as before.
    """
    global _last_render_seconds
    max_age = settings.FLEET_METRICS_MAX_AGE_SECONDS
    if max_age <= 0:
        return False
    redis = get_redis()
    if not redis.exists(_scraped_key()):
        return False  # nobody scrapes: an idle control plane renders nothing
    now = time.time() if now is None else now
    if now < _next_due(_stored_read_at(redis), max_age):
        return False
    began = time.perf_counter()
    if _render_under_lease(redis, max_age) is None:
        return False  # another process is rendering
    _last_render_seconds = time.perf_counter() - began
    return True


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding header admits gzip (Prometheus sends `gzip`)."""
    for part in accept_encoding.split(","):
        coding, _, params = part.strip().partition(";")
        if coding.strip().lower() in ("gzip", "*"):
            q = params.strip().lower()
            return not (q.startswith("q=") and _float(q[2:]) == 0.0)
    return False


def names_with_samples(kind: str, name: str) -> Sequence[str]:
    """The sample names a family exposes (a counter's `_total`), for tests and docs."""
    return (name + "_total",) if kind == "counter" else (name,)


def metrics_view(request: HttpRequest) -> HttpResponse:
    """GET /metrics of the control plane: the fleet exposition.

    Guarded like the proxy's /metrics: with METRICS_TOKEN set, only a scrape that sends it may read
    (core/metrics_access.py); unset, open, so keep the port on the monitoring network (docs/security.md).
    The token is checked before anything is read or served. The body is the latest render (at most
    FLEET_METRICS_MAX_AGE_SECONDS old), gzip'd when the scraper accepts it, as Prometheus does.
    """
    if request.method not in ("GET", "HEAD"):
        return HttpResponse("Use GET.\n", status=405, content_type="text/plain", headers={"Allow": "GET"})
    if not metrics_allowed(request.headers.get("Authorization")):
        return HttpResponse(
            REFUSAL + "\n", status=401, content_type="text/plain", headers={"WWW-Authenticate": "Bearer"}
        )
    exposition = current_exposition()
    response = HttpResponse(content_type=CONTENT_TYPE)
    if accepts_gzip(request.headers.get("Accept-Encoding", "")):
        response.content = exposition.gzipped
        response["Content-Encoding"] = "gzip"
    else:
        response.content = exposition.text()
    response["Vary"] = "Accept-Encoding"
    response["Cache-Control"] = "no-store"
    return response
