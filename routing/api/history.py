"""GET /api/history/: the charts' series of GPUs, engines, pools and tenants over a time range.

Thin: the subjects are checked and the series read in routing.rollups.series; bad ranges and unknown
subjects are JSON field errors.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from core.api.base import StrictSerializerMixin
from routing.rollups import series


class HistoryQuerySerializer(StrictSerializerMixin, serializers.Serializer):
    range = serializers.ChoiceField(
        choices=list(series.RANGES),
        default="1h",
        help_text="The time range ending at `end`; the resolution follows from it (10 s up to 1 h, "
        "1 min up to 24 h, then 1 h).",
    )
    subject = serializers.ListField(
        child=serializers.CharField(max_length=200),
        min_length=1,
        max_length=series.MAX_SUBJECTS,
        help_text="Repeat for several: gpu:<host>:<index>, engine:<deployment id>, pool:<pool name>, "
        "tenant:<tenant id>.",
    )
    end = serializers.DateTimeField(required=False, help_text="End of the range (default: now).")

    def validate_subject(self, value: list[str]) -> list[series.Subject]:
        subjects: list[series.Subject] = []
        problems: list[str] = []
        for text in value:
            try:
                subjects.append(series.parse_subject(text))
            except ValueError as exc:
                problems.append(str(exc))
        if problems:
            raise serializers.ValidationError(problems)
        return subjects


class HistorySeriesSerializer(serializers.Serializer):
    """One subject's columns: for each field, one value per time of `t` (null: no point there)."""

    subject = serializers.CharField()
    kind = serializers.ChoiceField(choices=["gpu", "engine", "pool", "tenant"])
    name = serializers.CharField(help_text="The GPU, deployment, pool or tenant as people name it.")
    values = serializers.DictField(
        child=serializers.ListField(child=serializers.FloatField(allow_null=True)),
        help_text="GPU: utilization_pct, memory_used_bytes, memory_total_bytes, temperature_c, "
        "power_watts. Engine: num_requests_running, num_requests_waiting, kv_cache_usage_perc, "
        "tokens_per_s, ttft_p95_s, itl_p95_s. Pool and tenant: requests_per_s, success_rate, "
        "latency_p50_ms, latency_p95_ms, prompt_tokens_per_s, completion_tokens_per_s; a pool also "
        "each of them as short_* and long_* (prompts under and at least PROXY_LONG_PROMPT_TOKENS).",
    )
    summary = serializers.DictField(
        child=serializers.FloatField(allow_null=True),
        help_text="The whole range as one value per field: gauge means; request rates over the range, "
        "and the success rate and latency percentiles of all its requests.",
    )


class HistorySerializer(serializers.Serializer):
    range = serializers.CharField()
    resolution_s = serializers.IntegerField(help_text="Seconds per point: 10, 60 or 3600.")
    start = serializers.FloatField(help_text="Start of the first bucket, unix seconds.")
    end = serializers.FloatField(help_text="End of the last bucket, unix seconds.")
    t = serializers.ListField(child=serializers.FloatField(), help_text="Bucket starts, unix seconds.")
    units = serializers.DictField(child=serializers.CharField(), help_text="Each field's unit.")
    series = HistorySeriesSerializer(many=True)


@extend_schema(parameters=[HistoryQuerySerializer], responses={200: HistorySerializer})
@api_view(["GET"])
def history(request: Request) -> Response:
    """Series of GPUs, engines, route pools and tenants over `range` (15m, 1h, 6h, 24h, 7d, 30d, 90d),
    from the downsampled rollups that beat writes (docs/monitoring.md "History")."""
    query = HistoryQuerySerializer(data=request.query_params)
    query.is_valid(raise_exception=True)
    params: dict[str, Any] = query.validated_data
    body = series.read(params["subject"], params["range"], params.get("end") or timezone.now())
    # Plain numbers already: up to 1,500 points per column are not passed through DRF's fields one by one.
    return Response(body)
