"""Hosts, deployments and their actions. Views stay thin: the checks and state changes are in services."""

from __future__ import annotations

from typing import Any

import django_filters
from django.db import transaction
from django.db.models import Prefetch
from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.decorators import action, api_view
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from core.api.base import AuditedModelViewSet
from core.audit import record_audit
from core.choices import AuditAction
from core.redis_client import publish_config_change
from models_registry.api.serializers import FitResultSerializer
from nodes import (
    agent_channel,
    agent_tokens,
    baselines,
    fleet_summary,
    history,
    lifecycle,
    placement,
    process,
    services,
)
from nodes.api.serializers import (
    BaselineCheckSerializer,
    DeploymentEventSerializer,
    DeploymentLogSerializer,
    DeploymentSerializer,
    FleetSummaryQuerySerializer,
    FleetSummarySerializer,
    HistoryQuerySerializer,
    HostSerializer,
    PerformanceBaselineSerializer,
    PlacementAnswerSerializer,
    PlacementRequestSerializer,
    PreflightResultSerializer,
    PreflightSerializer,
    SleepSerializer,
    StopSerializer,
    TelemetryHistorySerializer,
)
from nodes.choices import ACTIVE_STATES, DeploymentState
from nodes.models import Deployment, Gpu, Host, PerformanceBaseline
from nodes.preflight import preflight
from nodes.spec import DeploySpec

MAX_LOG_LINES = 1000


class PlainTextRenderer(BaseRenderer):
    media_type = "text/plain"
    format = "txt"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> Any:
        return data if isinstance(data, (str, bytes)) else str(data)


class LiveListMixin:
    """Lists read every row's live value from Redis in one MGET instead of one GET per row."""

    def live_keys(self, rows: list[Any]) -> list[str]:
        raise NotImplementedError

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        view: Any = self
        queryset = view.filter_queryset(view.get_queryset())
        page = view.paginate_queryset(queryset)
        rows = list(page if page is not None else queryset)
        context = {**view.get_serializer_context(), "live": lifecycle.read_live_many(self.live_keys(rows))}
        data = view.get_serializer_class()(rows, many=True, context=context).data
        return view.get_paginated_response(data) if page is not None else Response(data)


class HostFilter(django_filters.FilterSet):
    """`?state=` and `?role=` as before; `?down=true` the hosts not reachable (fleet_summary says which)."""

    down = django_filters.BooleanFilter(method="filter_down", label="Only hosts down (true) or up (false)")

    class Meta:
        model = Host
        fields = ["state", "role"]

    def filter_down(self, queryset: Any, name: str, value: bool | None) -> Any:
        if value is None:
            return queryset
        down = fleet_summary.down_hosts_filter()
        return queryset.filter(down) if value else queryset.exclude(down)


class DeploymentFilter(django_filters.FilterSet):
    """By host (id, or `host_name`), state, engine, served name, role, and model (its name)."""

    host_name = django_filters.CharFilter(field_name="host__name")
    model = django_filters.CharFilter(field_name="model_version__model__name", label="Model name")

    class Meta:
        model = Deployment
        fields = ["host", "state", "engine", "served_model_name", "role"]


class HostViewSet(LiveListMixin, AuditedModelViewSet):
    """Node hosts. GPUs and heartbeats are reported by each host's agent."""

    def live_keys(self, rows: list[Any]) -> list[str]:
        return [lifecycle.live_gpu_key(host.name, gpu.index) for host in rows for gpu in host.gpus.all()]

    serializer_class = HostSerializer
    filterset_class = HostFilter
    search_fields = ["name", "address", "role"]
    ordering_fields = ["name", "last_heartbeat", "state", "address", "role"]

    def get_queryset(self) -> Any:
        return Host.objects.prefetch_related(
            "gpus",
            "agent_tokens",
            Prefetch("deployments", queryset=Deployment.objects.only("id", "host_id", "state")),
        )

    def perform_create(self, serializer: Any) -> None:
        """A new host gets its agent token at once; the create response shows it, nothing else ever does."""
        with transaction.atomic():
            super().perform_create(serializer)
            issued = agent_tokens.issue_agent_token(serializer.instance, actor=self.request.user)
        self._new_token = issued.raw_token

    def get_serializer_context(self) -> dict[str, Any]:
        context = super().get_serializer_context()
        if getattr(self, "_new_token", None):
            context["new_agent_token"] = self._new_token
        return context

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        response = super().create(request, *args, **kwargs)
        if getattr(self, "_new_token", None):
            response.data["new_agent_token"] = self._new_token
        return response

    @extend_schema(request=None, responses={200: HostSerializer})
    @action(detail=True, methods=["post"], url_path="rotate-agent-token")
    def rotate_agent_token(self, request: Request, pk: str | None = None) -> Response:
        """A new agent token for this host (shown once in the answer); the previous one stops working."""
        host = self.get_object()
        issued = agent_tokens.issue_agent_token(host, actor=request.user)
        host = self.get_queryset().get(pk=host.pk)
        context = {**self.get_serializer_context(), "new_agent_token": issued.raw_token}
        return Response(HostSerializer(host, context=context).data)

    @extend_schema(request=None, responses={200: HostSerializer})
    @action(detail=True, methods=["post"], url_path="revoke-agent-token")
    def revoke_agent_token(self, request: Request, pk: str | None = None) -> Response:
        """Revoke the host's agent token: its agent is refused from its next call; engines keep serving."""
        host = self.get_object()
        agent_tokens.revoke_agent_tokens(host, actor=request.user)
        return Response(self.get_serializer(self.get_queryset().get(pk=host.pk)).data)

    def perform_destroy(self, instance: Any) -> None:
        if instance.deployments.exists():
            raise ValidationError({"host": ["Delete or move this host's deployments first."]})
        super().perform_destroy(instance)

    def _set_draining(self, request: Request, draining: bool) -> Response:
        host = self.get_object()
        with transaction.atomic():
            before = host.state
            services.set_host_draining(host, draining)
            record_audit(
                actor=request.user,
                action=AuditAction.ACTION,
                obj=host,
                before={"state": before},
                after={"state": host.state},
            )
        return Response(self.get_serializer(host).data)

    @extend_schema(request=None, responses={200: HostSerializer})
    @action(detail=True, methods=["post"])
    def drain(self, request: Request, pk: str | None = None) -> Response:
        """Accept no new deployments on this host; running engines keep serving."""
        return self._set_draining(request, True)

    @extend_schema(request=None, responses={200: HostSerializer})
    @action(detail=True, methods=["post"])
    def undrain(self, request: Request, pk: str | None = None) -> Response:
        return self._set_draining(request, False)


class DeploymentViewSet(LiveListMixin, AuditedModelViewSet):
    """Deployments of model versions onto hosts, with start/stop/restart/drain actions."""

    def live_keys(self, rows: list[Any]) -> list[str]:
        return [lifecycle.live_deployment_key(d.pk) for d in rows]

    serializer_class = DeploymentSerializer
    filterset_class = DeploymentFilter
    search_fields = ["name", "served_model_name", "host__name", "model_version__model__name"]
    ordering_fields = ["name", "state", "created_at", "served_model_name", "host__name", "port", "engine"]

    def get_queryset(self) -> Any:
        return Deployment.objects.select_related(
            "host", "model_version__model", "quantization"
        ).prefetch_related("members__host")

    def perform_create(self, serializer: Any) -> None:
        with transaction.atomic():
            serializer.save(created_by=self.request.user)
            deployment = serializer.instance
            record_audit(
                actor=self.request.user,
                action=AuditAction.CREATE,
                obj=deployment,
                after=self.snapshot(deployment),
            )
            publish_config_change("deployment", id=deployment.pk)
            services.request_start(
                deployment, f"Deployment created; launch queued on {deployment.host.name}."
            )

    def perform_destroy(self, instance: Any) -> None:
        if instance.state in ACTIVE_STATES and instance.state != DeploymentState.PENDING:
            raise ValidationError({"state": [f"Stop the deployment first (it is {instance.state})."]})
        pk = instance.pk
        super().perform_destroy(instance)
        publish_config_change("deployment", id=pk)

    def _act(self, request: Request, verb: str, **kwargs: Any) -> Response:
        deployment = self.get_object()
        with transaction.atomic():
            if verb == "start":
                services.request_start(deployment)
            elif verb == "restart":
                services.request_restart(deployment)
            else:
                services.request_stop(deployment, **kwargs)
            record_audit(
                actor=request.user,
                action=AuditAction.ACTION,
                obj=deployment,
                after={"action": verb, **kwargs},
            )
        deployment.refresh_from_db()
        return Response(self.get_serializer(deployment).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={202: DeploymentSerializer})
    @action(detail=True, methods=["post"])
    def start(self, request: Request, pk: str | None = None) -> Response:
        deployment = self.get_object()
        if not lifecycle.host_is_reachable(deployment.host):
            raise ValidationError(
                {"host": [f"Host {deployment.host.name} is unreachable; start its agent first."]}
            )
        return self._act(request, "start")

    @extend_schema(request=StopSerializer, responses={202: DeploymentSerializer})
    @action(detail=True, methods=["post"])
    def stop(self, request: Request, pk: str | None = None) -> Response:
        params = StopSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        return self._act(request, "stop", drain=params.validated_data["drain"])

    @extend_schema(request=None, responses={202: DeploymentSerializer})
    @action(detail=True, methods=["post"])
    def drain(self, request: Request, pk: str | None = None) -> Response:
        return self._act(request, "drain", drain=True)

    @extend_schema(request=None, responses={202: DeploymentSerializer})
    @action(detail=True, methods=["post"])
    def restart(self, request: Request, pk: str | None = None) -> Response:
        return self._act(request, "restart")

    def _sleep_or_wake(self, request: Request, verb: str, level: int | None = None) -> Response:
        deployment = self.get_object()
        try:
            with transaction.atomic():
                if verb == "sleep":
                    assert level is not None
                    services.request_sleep(deployment, level, "Sleep requested by an admin.")
                else:
                    services.request_wake_up(deployment, "Wake requested by an admin.")
                record_audit(
                    actor=request.user,
                    action=AuditAction.ACTION,
                    obj=deployment,
                    after={"action": verb, **({"level": level} if level is not None else {})},
                )
        except services.SleepRefused as exc:
            raise ValidationError({exc.field: [exc.message]}) from None
        deployment.refresh_from_db()
        return Response(self.get_serializer(deployment).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=SleepSerializer, responses={202: DeploymentSerializer})
    @action(detail=True, methods=["post"])
    def sleep(self, request: Request, pk: str | None = None) -> Response:
        """Put the engine to sleep (its agent calls POST /sleep?level=N and confirms)."""
        params = SleepSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        level = params.validated_data["level"]
        return self._sleep_or_wake(
            request, "sleep", self.get_object().sleep_level if level is None else level
        )

    @extend_schema(request=None, responses={202: DeploymentSerializer})
    @action(detail=True, methods=["post"])
    def wake(self, request: Request, pk: str | None = None) -> Response:
        """Wake a sleeping engine (its agent calls POST /wake_up and confirms)."""
        return self._sleep_or_wake(request, "wake")

    @extend_schema(responses={200: DeploymentEventSerializer(many=True)})
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def events(self, request: Request, pk: str | None = None) -> Response:
        deployment = self.get_object()
        events = deployment.events.all()[:200]
        return Response(DeploymentEventSerializer(events, many=True).data)

    @extend_schema(responses={200: BaselineCheckSerializer})
    @action(
        detail=True, methods=["get"], url_path="baseline-check", pagination_class=None, filter_backends=[]
    )
    def baseline_check(self, request: Request, pk: str | None = None) -> Response:
        """The engine's live TTFT p95 at its current load against its newest performance baseline."""
        deployment = self.get_object()
        baseline = deployment.baselines.first()
        live = lifecycle.read_live(lifecycle.live_deployment_key(deployment.pk))
        return Response(BaselineCheckSerializer(baselines.compare(baseline, live)).data)

    @extend_schema(responses={200: DeploymentLogSerializer})
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def logs(self, request: Request, pk: str | None = None) -> Response:
        """The tail of the engine's log: asked of the host's agent when it is on the agent channel (any
        host), read from the file when this web process shares the host's disk (the co-located agent);
        otherwise the lines the agent attached at the engine's last exit."""
        deployment = self.get_object()
        try:
            lines = max(1, min(MAX_LOG_LINES, int(request.query_params.get("lines", 200))))
        except ValueError:
            raise ValidationError({"lines": ["An integer."]}) from None
        body = _log_tail(deployment, lines, agent_channel.LOG_MAX_BYTES)
        body["lines"] = body.pop("text").splitlines()
        return Response(DeploymentLogSerializer(body).data)

    @extend_schema(responses={(200, "text/plain"): OpenApiTypes.STR})
    @action(
        detail=True,
        methods=["get"],
        url_path="log-download",
        pagination_class=None,
        filter_backends=[],
        renderer_classes=[PlainTextRenderer],
    )
    def log_download(self, request: Request, pk: str | None = None) -> HttpResponse:
        """The engine's log as a text file: its last LOG_DOWNLOAD_MAX_BYTES (8 MiB), from wherever it runs."""
        deployment = self.get_object()
        body = _log_tail(
            deployment, agent_channel.LOG_DOWNLOAD_MAX_LINES, agent_channel.LOG_DOWNLOAD_MAX_BYTES
        )
        response = HttpResponse(body["text"], content_type="text/plain; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="{deployment.name}.log"'
        return response

    @extend_schema(request=PreflightSerializer, responses={200: PreflightResultSerializer})
    @action(detail=False, methods=["post"], pagination_class=None, filter_backends=[])
    def preflight(self, request: Request) -> Response:
        """Run every pre-launch check and the fit check without creating anything."""
        params = PreflightSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        check = preflight(DeploySpec.from_values(params.validated_data))
        fit = FitResultSerializer(check.fit).data if check.fit is not None else None
        return Response(PreflightResultSerializer({"ok": check.ok, "errors": check.errors, "fit": fit}).data)

    @extend_schema(request=PlacementRequestSerializer, responses={200: PlacementAnswerSerializer})
    @action(detail=False, methods=["post"], pagination_class=None, filter_backends=[])
    def placement(self, request: Request) -> Response:
        """The deploy wizard's placement help (nodes/placement.py): free memory per GPU, a placement that
        fits, the verdict with its whole arithmetic and, when it does not fit, what would."""
        params = PlacementRequestSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        values = params.validated_data
        try:
            answer = placement.placement_help(
                version=values["model_version"],
                quantization=values["quantization"],
                engine=values["engine"],
                host=values["host"],
                gpu_indices=values["gpu_indices"],
                settings=placement.EngineSettings(
                    max_model_len=values["max_model_len"],
                    gpu_memory_utilization=values["gpu_memory_utilization"],
                    max_num_seqs=values["max_num_seqs"],
                    max_num_batched_tokens=values["max_num_batched_tokens"],
                    tensor_parallel_size=values["tensor_parallel_size"],
                ),
            )
        except placement.PlacementError as exc:
            raise ValidationError({exc.field: [str(exc)]}) from None
        return Response(PlacementAnswerSerializer(answer).data)


class PerformanceBaselineViewSet(AuditedModelViewSet):
    """Saved `inferchain bench` runs of a deployment: what its normal speed looks like (docs/bench.md)."""

    serializer_class = PerformanceBaselineSerializer
    http_method_names = ["get", "post", "delete", "head", "options"]
    filterset_fields = ["deployment"]
    ordering_fields = ["created_at", "name"]

    def get_queryset(self) -> Any:
        return PerformanceBaseline.objects.select_related("created_by")

    def perform_create(self, serializer: Any) -> None:
        with transaction.atomic():
            instance = serializer.save(created_by=self.request.user)
            record_audit(
                actor=self.request.user,
                action=AuditAction.CREATE,
                obj=instance,
                after=self.snapshot(instance),
            )


@extend_schema(parameters=[FleetSummaryQuerySerializer], responses={200: FleetSummarySerializer})
@api_view(["GET"])
def fleet_summary_view(request: Request) -> Response:
    """The fleet at a glance: totals by state, the hosts down (named), per-pool aggregates of the engines'
    live records, and the `top` busiest engines and hottest GPUs. What the dashboard shows for a fleet of
    any size (nodes/fleet_summary.py)."""
    query = FleetSummaryQuerySerializer(data=request.query_params)
    query.is_valid(raise_exception=True)
    return Response(fleet_summary.fleet_summary(query.validated_data["top"]))


@extend_schema(parameters=[HistoryQuerySerializer], responses={200: TelemetryHistorySerializer})
@api_view(["GET"])
def telemetry_history(request: Request) -> Response:
    """The last `minutes` (up to 60) of GPU and engine samples, as columns for charts.

    Without filters: every GPU and every deployment. `host` narrows both to one host; `deployment` to
    one deployment and the GPUs it runs on. Series that the agents never wrote come back empty.
    """
    query = HistoryQuerySerializer(data=request.query_params)
    query.is_valid(raise_exception=True)
    params = query.validated_data
    gpus = Gpu.objects.select_related("host").order_by("host__name", "index")
    deployments = Deployment.objects.select_related("host").order_by("host__name", "name")
    if "host" in params:
        gpus = gpus.filter(host__name=params["host"])
        deployments = deployments.filter(host__name=params["host"])
    if "deployment" in params:
        deployment = Deployment.objects.filter(pk=params["deployment"]).first()
        if deployment is None:
            raise ValidationError({"deployment": [f"No deployment with id {params['deployment']}."]})
        deployments = deployments.filter(pk=deployment.pk)
        gpus = gpus.filter(host_id=deployment.host_id, index__in=deployment.gpu_indices or [])
    gpu_rows = list(gpus)
    deployment_rows = list(deployments)
    gpu_series, engine_series = history.read(
        [(g.host.name, g.index) for g in gpu_rows], [d.pk for d in deployment_rows], params["minutes"]
    )
    body = {
        "minutes": params["minutes"],
        "gpus": [
            {
                "host": g.host.name,
                "index": g.index,
                "memory_total_bytes": g.memory_total_bytes,
                "simulated": g.simulated,
                "t": gpu_series[(g.host.name, g.index)].t,
                **gpu_series[(g.host.name, g.index)].values,
            }
            for g in gpu_rows
        ],
        "engines": [
            {
                "deployment_id": d.pk,
                "name": d.name,
                "host": d.host.name,
                "t": engine_series[d.pk].t,
                **engine_series[d.pk].values,
            }
            for d in deployment_rows
        ],
    }
    # Already plain numbers: up to 3,600 points per column are not passed through DRF's fields one by one.
    return Response(body)


def _log_tail(deployment: Deployment, lines: int, max_bytes: int) -> dict[str, Any]:
    """{source, path, text} of the deployment's engine log, from its agent or this machine's disk."""
    if agent_channel.uses_agent_channel(deployment.host):
        answer = agent_channel.request_log(deployment, lines=lines, max_bytes=max_bytes)
        if answer is not None and answer.get("path"):
            return {"source": "agent", "path": answer["path"], "text": answer["text"]}
        text = ""
    else:
        text = process.tail(deployment.log_path, lines, max_bytes) if deployment.log_path else ""
    if text:
        return {"source": "file", "path": deployment.log_path, "text": text}
    return {"source": "last_exit", "path": deployment.log_path, "text": deployment.last_log_lines}
