"""Prometheus exposition of the fleet: every host's GPUs, every engine's scraped state, tenants' budgets.

The agents already publish all of it (nodes/agent/supervisor.py): a live JSON record per GPU and per
engine in Redis with a short TTL (`nodes.lifecycle.live_gpu_key` / `live_deployment_key`), and the
proxy's limiter keeps each tenant's tokens of the day. A scrape reads the inventory from the database
(hosts, GPUs, deployments, tenants with a budget: four queries), every live record in one MGET, and
builds the families at scrape time. Nothing is cached between scrapes, so a number is never older
than the agent's tick plus the scrape; an expired record (a dead agent, a stopped engine) is absent,
not stale, and the `*_up` gauges say so.

Labels are bounded by the inventory: one series per GPU, per deployment, per tenant with a budget.
No label carries a request, a prompt or a free-form value; `METRICS` below is the documented list
(docs/monitoring.md is generated from the same names and the test checks both).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson
from django.conf import settings
from django.http import HttpRequest, HttpResponse

from console.models import Quota
from core.metrics_access import REFUSAL, metrics_allowed
from core.redis_client import get_redis
from nodes.choices import DeploymentState, DesiredState
from nodes.lifecycle import live_deployment_key, live_gpu_key
from nodes.models import Deployment, Gpu, Host
from routing.proxy.limits import budget_key, tenant_scope

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


@dataclass
class FleetState:
    """What one scrape reads: the inventory and the live records, keyed as the families need them."""

    hosts: list[tuple[str, bool]]
    gpus: list[tuple[tuple[str, str, str], str, bool, dict[str, Any] | None]]
    deployments: list[tuple[tuple[str, str, str, str], Any, dict[str, Any] | None]]
    tenants: list[tuple[str, int, int]]


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
        )
    ]
    budgets = list(
        Quota.objects.filter(tenant__isnull=False, daily_token_budget__isnull=False)
        .order_by("tenant__name")
        .values_list("tenant_id", "tenant__name", "daily_token_budget")
    )
    day = dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y%m%d")
    keys = (
        [live_gpu_key(h, i) for h, i, *_ in gpu_rows]
        + [live_deployment_key(d.pk) for d in deployments]
        + [budget_key(tenant_scope(tid), day) for tid, _, _ in budgets]
    )
    raws: list[Any] = [None] * len(keys)
    if keys:
        # Redis down: every live value is absent and the *_up gauges read 0.
        with contextlib.suppress(Exception):
            raws = get_redis().mget(keys)
    n_gpus, n_deps = len(gpu_rows), len(deployments)
    gpus = [
        ((h, str(i), uuid), name, simulated, _json(raws[k]))
        for k, (h, i, uuid, name, simulated) in enumerate(gpu_rows)
    ]
    deps = [
        (
            (d.name, d.served_model_name, f"{d.model}@{d.revision}", d.host),
            d,
            _json(raws[n_gpus + k]),
        )
        for k, d in enumerate(deployments)
    ]
    tenants = [
        (name, int(budget or 0), _int(raws[n_gpus + n_deps + k]))
        for k, (_tid, name, budget) in enumerate(budgets)
    ]
    return FleetState(hosts=hosts, gpus=gpus, deployments=deps, tenants=tenants)


def _json(raw: Any) -> dict[str, Any] | None:
    if not raw:
        return None
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _int(raw: Any) -> int:
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

    out: list[str] = []
    for m in METRICS:
        out.append(_HEADER[m.name])
        out.extend(lines[m.name])
    return "".join(out).encode()


def render(state: FleetState | None = None) -> bytes:
    """The text exposition of one scrape."""
    return render_state(read_state() if state is None else state)


def names_with_samples(kind: str, name: str) -> Sequence[str]:
    """The sample names a family exposes (a counter's `_total`), for tests and docs."""
    return (name + "_total",) if kind == "counter" else (name,)


def metrics_view(request: HttpRequest) -> HttpResponse:
    """GET /metrics of the control plane: the fleet exposition.

    Guarded like the proxy's /metrics: with METRICS_TOKEN set, only a scrape that sends it may read
    (core/metrics_access.py); unset, open, so keep the port on the monitoring network (docs/security.md).
    """
    if request.method not in ("GET", "HEAD"):
        return HttpResponse("Use GET.\n", status=405, content_type="text/plain", headers={"Allow": "GET"})
    if not metrics_allowed(request.headers.get("Authorization")):
        return HttpResponse(
            REFUSAL + "\n", status=401, content_type="text/plain", headers={"WWW-Authenticate": "Bearer"}
        )
    return HttpResponse(render(), content_type=CONTENT_TYPE)
