"""Admin API for stage chains: per alias or tenant, checked when saved, versioned and audited."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from console.models import Tenant
from core.api.base import AuditedModelViewSet, StrictModelSerializer
from routing.api.views import NotifyProxiesMixin
from routing.chains import check_chain, record_version
from routing.models import StageChain, StageChainVersion
from routing.proxy.stagespec import KINDS, ChainError

STAGES_SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "kind": {"type": "string", "enum": list(KINDS)},
            "name": {"type": "string"},
            "config": {"type": "object", "additionalProperties": True},
        },
        "required": ["kind"],
    },
}


@extend_schema_field(STAGES_SCHEMA)
class StagesField(serializers.JSONField):
    pass


class StageChainSerializer(StrictModelSerializer):
    stages = StagesField(
        help_text="Pre-stages, exactly one {'kind': 'generate'} step, then post-stages "
        "(routing/proxy/stagespec.py)."
    )
    tenant = serializers.SlugRelatedField(
        slug_field="name", queryset=Tenant.objects.all(), allow_null=True, required=False
    )

    class Meta:
        model = StageChain
        fields = ["id", "name", "alias", "tenant", "stages", "enabled", "version", "updated_at"]
        read_only_fields = ["id", "version", "updated_at"]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        instance: StageChain | None = self.instance
        name = attrs.get("name", instance.name if instance else "")
        alias = attrs.get("alias", instance.alias if instance else "")
        tenant = attrs.get("tenant", instance.tenant if instance else None)
        stages = attrs.get("stages", instance.stages if instance else [])
        if alias or tenant is not None:
            same = StageChain.objects.filter(alias=alias, tenant=tenant)
            if instance is not None:
                same = same.exclude(pk=instance.pk)
            if same.exists():
                raise serializers.ValidationError(
                    {"alias": f"The chain '{same.first()}' already applies to this alias and tenant."}
                )
        try:
            check_chain(
                name, stages, scoped=bool(alias) or tenant is not None, pk=instance.pk if instance else None
            )
        except ChainError as exc:
            raise serializers.ValidationError({"stages": str(exc)}) from None
        return attrs

    def create(self, validated_data: dict[str, Any]) -> StageChain:
        chain: StageChain = super().create(validated_data)
        record_version(chain, self.context["request"].user)
        return chain

    def update(self, instance: StageChain, validated_data: dict[str, Any]) -> StageChain:
        instance.version += 1
        chain: StageChain = super().update(instance, validated_data)
        record_version(chain, self.context["request"].user)
        return chain


class StageChainVersionSerializer(serializers.ModelSerializer):
    created_by: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="username", read_only=True
    )

    class Meta:
        model = StageChainVersion
        fields = ["version", "stages", "alias", "tenant_id", "enabled", "created_at", "created_by"]
        read_only_fields = fields


class StageChainViewSet(NotifyProxiesMixin, AuditedModelViewSet):
    queryset = StageChain.objects.select_related("tenant")
    serializer_class = StageChainSerializer
    config_kind = "stage_chain"
    filterset_fields = ["alias", "enabled"]
    search_fields = ["name", "alias"]

    @extend_schema(responses=StageChainVersionSerializer(many=True))
    @action(detail=True, methods=["get"])
    def versions(self, request: Request, pk: str | None = None) -> Response:
        """Every saved version of the chain, newest first."""
        chain = self.get_object()
        rows = chain.versions.select_related("created_by")
        return Response(StageChainVersionSerializer(rows, many=True).data)
