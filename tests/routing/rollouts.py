"""Builders for rollout tests: an alias with two versions, ready deployment rows, request-log rows."""

from __future__ import annotations

import datetime as dt
import secrets
from dataclasses import dataclass

from django.utils import timezone

from models_registry.evaluation.models import EvalRun, EvalSuite, EvalSuiteVersion, EvalVerdict
from models_registry.models import ModelAlias, ModelVersion
from nodes.models import Deployment, Host
from routing.models import RequestLog, ShadowPair
from tests.routing.fleet import ensure_alias


@dataclass
class Canary:
    alias: ModelAlias
    v1: ModelVersion  # the active version (baseline)
    v2: ModelVersion  # the candidate


def new_version(alias: ModelAlias, revision: str) -> ModelVersion:
    base = alias.active_version
    return ModelVersion.objects.create(
        model=base.model,
        revision=revision,
        source_kind="directory",
        source_path=f"/models/{base.model.name}-{revision}",
        max_context=base.max_context,
    )


def ready_deployment(alias: ModelAlias, version: ModelVersion, port: int = 0) -> Deployment:
    """A ready Deployment row serving the alias (no engine behind it: for the control plane's checks)."""
    host, _ = Host.objects.get_or_create(name="rollout-host", defaults={"address": "127.0.0.1"})
    port = port or 20000 + Deployment.objects.count()
    return Deployment.objects.create(
        name=f"{alias.name}-{version.revision}-{port}",
        model_version=version,
        host=host,
        port=port,
        served_model_name=alias.name,
        max_model_len=4096,
        state="ready",
        start_token=secrets.token_hex(8),
        engine="sim",
    )


def canary(alias_name: str = "llama-canary") -> Canary:
    alias = ensure_alias(alias_name)
    v2 = new_version(alias, "v2")
    ready_deployment(alias, alias.active_version)
    ready_deployment(alias, v2)
    return Canary(alias, alias.active_version, v2)


def log_requests(
    alias: ModelAlias,
    version: ModelVersion,
    n: int,
    *,
    status: int = 200,
    latency_ms: float = 100.0,
    ttft_ms: float | None = 20.0,
    at: dt.datetime | None = None,
    error_type: str = "",
) -> None:
    """`n` request-log rows as the proxy writes them for answers of `version` on `alias`."""
    when = at or timezone.now()
    RequestLog.objects.bulk_create(
        [
            RequestLog(
                created_at=when,
                request_id=secrets.token_hex(8),
                alias=alias.name,
                model_version_id=version.pk,
                status=status,
                error_type=error_type,
                stream=ttft_ms is not None,
                latency_ms=latency_ms,
                ttft_ms=ttft_ms,
                endpoint_kind="chat",
            )
            for _ in range(n)
        ]
    )


def accepted_run(version: ModelVersion, decision: str | None = "accept", **summary: object) -> EvalRun:
    """A completed offline evaluation of `version` with a current verdict `decision` (None: unsigned)."""
    run = completed_run(version, **summary)
    if decision is not None:
        EvalVerdict.objects.create(run=run, decision=decision, candidate_version=version)
    return run


def completed_run(version: ModelVersion, **summary: object) -> EvalRun:
    """A completed offline evaluation of `version`, not yet signed."""
    suite = EvalSuite.objects.create(name=f"suite-{secrets.token_hex(3)}")
    suite_version = EvalSuiteVersion.objects.create(suite=suite, number=1)
    return EvalRun.objects.create(
        suite_version=suite_version,
        reference_base_url="http://ref",
        reference_model="ref",
        candidate_base_url="http://cand",
        candidate_model="cand",
        candidate_info={"model_version_id": version.pk},
        state="completed",
        finished_at=timezone.now(),
        summary=summary,
    )


def shadow_pair(
    alias: ModelAlias,
    primary: ModelVersion,
    candidate: ModelVersion,
    primary_output: str,
    candidate_output: str,
    *,
    prompt: str = "Say something.",
    error: str = "",
    at: dt.datetime | None = None,
    alias_name: str = "",
) -> ShadowPair:
    """A ShadowPair row as the proxy's pair writer stores it: scored when the candidate answered."""
    from routing.proxy.shadow import score_pair

    scores = score_pair(primary_output, candidate_output) if not error else {}
    return ShadowPair.objects.create(
        created_at=at or timezone.now(),
        request_id=secrets.token_hex(8),
        alias=alias_name or alias.name,
        tenant_id=None,
        endpoint_kind="chat",
        primary_version_id=primary.pk,
        candidate_version_id=candidate.pk,
        request={
            "model": alias_name or alias.name,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 32,
        },
        primary_output=primary_output,
        candidate_output="" if error else candidate_output,
        primary_latency_ms=120.0,
        candidate_latency_ms=None if error else 150.0,
        candidate_status=500 if error else 200,
        candidate_error=error,
        exact_match=scores.get("exact_match"),
        first_divergence=scores.get("first_divergence"),
        chrf=scores.get("chrf"),
        scores=scores,
    )
