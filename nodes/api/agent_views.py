"""The agent channel: /api/agent/sync/ and /api/agent/logs/, called by host agents with their token.

Not a console API: no session, no role; the host's agent token (Authorization: Bearer) is the only
credential, and it must belong to the host the call names. Errors are JSON:
{"error": {"code", "message"}} (401 for a missing, unknown or revoked token, 403 for another host's).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.decorators import api_view, authentication_classes, permission_classes, throttle_classes
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response

from core.api.base import StrictSerializerMixin
from nodes import agent_channel
from nodes.agent_tokens import AgentRefused, authenticate_agent, hash_agent_token
from nodes.models import Host


class ChangeSerializer(serializers.Serializer):
    id = serializers.CharField(max_length=64)
    kind = serializers.ChoiceField(choices=agent_channel.CHANGE_KINDS)
    deployment_id = serializers.IntegerField(min_value=1)
    start_token = serializers.CharField(max_length=64, allow_blank=True)
    at = serializers.FloatField(required=False)
    message = serializers.CharField(required=False, allow_blank=True, max_length=4000)
    log_tail = serializers.CharField(required=False, allow_blank=True, max_length=100_000)
    pid = serializers.IntegerField(required=False, min_value=1)
    log_path = serializers.CharField(required=False, allow_blank=True, max_length=500)
    kernel = serializers.CharField(required=False, allow_blank=True, max_length=64)
    # A `fetched` change's report (files, bytes, times); checked where it is applied
    # (agent_channel._fetch_report), so a wrong one is refused alone rather than the whole batch.
    fetch = serializers.DictField(required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["kind"] == "started" and "pid" not in attrs:
            raise serializers.ValidationError({"pid": ["A started change names the engine's pid."]})
        return attrs


class RayNodeReportSerializer(serializers.Serializer):
    """One Ray node the agent runs for a deployment spanning hosts, and whether it joined its cluster."""

    deployment_id = serializers.IntegerField(min_value=1)
    role = serializers.ChoiceField(choices=["head", "worker"])
    joined = serializers.BooleanField()


class SyncSerializer(StrictSerializerMixin, serializers.Serializer):
    host = serializers.CharField(max_length=63)
    info = serializers.DictField(required=False, default=dict)
    gpu_inventory = serializers.ListField(child=serializers.DictField(), required=False, allow_null=True)
    gpus = serializers.ListField(child=serializers.DictField(), required=False, default=list, max_length=64)
    engines = serializers.ListField(
        child=serializers.DictField(), required=False, default=list, max_length=1000
    )
    changes = ChangeSerializer(many=True, required=False, default=list)
    ray_nodes = serializers.ListField(
        child=RayNodeReportSerializer(), required=False, default=list, max_length=1000
    )
    # The generation of the last full answer the agent applied (nodes/agent_generation.py); the full
    # path answers whatever it says, the ingest only while it is current.
    generation = serializers.IntegerField(required=False, allow_null=True)


class LogAnswerSerializer(StrictSerializerMixin, serializers.Serializer):
    host = serializers.CharField(max_length=63)
    request_id = serializers.CharField(max_length=64)
    deployment_id = serializers.IntegerField(min_value=1)
    path = serializers.CharField(required=False, allow_blank=True, max_length=1000)
    text = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False)
    truncated = serializers.BooleanField(required=False, default=False)


def _refused(exc: AgentRefused) -> Response:
    return Response({"error": {"code": exc.code, "message": exc.message}}, status=exc.status)


def _token_digest(request: Request) -> str:
    """The digest of the bearer token that just authenticated (the sync snapshot is bound to it)."""
    raw = request.headers.get("Authorization", "")[7:].strip()
    return hash_agent_token(raw) if raw else ""


def _authenticate(request: Request) -> Host:
    host_name = str(request.data.get("host", "")) if isinstance(request.data, dict) else ""
    return authenticate_agent(
        request.headers.get("Authorization", ""), host_name, request.META.get("REMOTE_ADDR", "")
    )


@extend_schema(exclude=True)
@api_view(["POST"])
@authentication_classes([])
@permission_classes([AllowAny])
@throttle_classes([])
def agent_sync(request: Request) -> Response:
    """One batch from a host's agent (heartbeat, telemetry, queued changes) -> what the host must run."""
    try:
        host = _authenticate(request)
    except AgentRefused as exc:
        return _refused(exc)
    batch = SyncSerializer(data=request.data)
    batch.is_valid(raise_exception=True)
    data = dict(batch.validated_data)
    data["changes"] = [dict(c) for c in data.get("changes", [])]
    data["ray_nodes"] = [dict(r) for r in data.get("ray_nodes", [])]
    return Response(agent_channel.sync(host, data, token_digest=_token_digest(request)))


@extend_schema(exclude=True)
@api_view(["POST"])
@authentication_classes([])
@permission_classes([AllowAny])
@throttle_classes([])
def agent_logs(request: Request) -> Response:
    """An agent's answer to a log request the control plane handed it."""
    try:
        host = _authenticate(request)
    except AgentRefused as exc:
        return _refused(exc)
    answer = LogAnswerSerializer(data=request.data)
    answer.is_valid(raise_exception=True)
    if not agent_channel.answer_log(host, dict(answer.validated_data)):
        return Response(
            {"error": {"code": "log_request_unknown", "message": "No such log request for this host."}},
            status=404,
        )
    return Response({"ok": True})
