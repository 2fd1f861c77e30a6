"""Shared pieces for every app's API: strict serializers and audited viewsets."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db import transaction
from rest_framework import serializers, viewsets

from core.audit import record_audit
from core.choices import AuditAction


class StrictSerializerMixin:
    """Reject fields the serializer does not know, instead of silently dropping them (nested ones too)."""

    fields: Any

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            writable = {name for name, field in self.fields.items() if not field.read_only}
            unknown = sorted(set(data) - writable)
            if unknown:
                raise serializers.ValidationError({name: ["Unknown or read-only field."] for name in unknown})
        return super().to_internal_value(data)  # type: ignore[misc]


class StrictModelSerializer(StrictSerializerMixin, serializers.ModelSerializer):
    pass


class AuditedModelViewSet(viewsets.ModelViewSet):
    """A ModelViewSet whose writes each leave an AuditEvent with before/after snapshots."""

    def snapshot(self, instance: Any) -> dict[str, Any]:
        return dict(self.get_serializer(instance).data)

    def perform_create(self, serializer: Any) -> None:
        with transaction.atomic():
            instance = serializer.save()
            record_audit(
                actor=self.request.user,
                action=AuditAction.CREATE,
                obj=instance,
                after=self.snapshot(instance),
            )

    def perform_update(self, serializer: Any) -> None:
        with transaction.atomic():
            before = self.snapshot(serializer.instance)
            instance = serializer.save()
            record_audit(
                actor=self.request.user,
                action=AuditAction.UPDATE,
                obj=instance,
                before=before,
                after=self.snapshot(instance),
            )

    def perform_destroy(self, instance: Any) -> None:
        with transaction.atomic():
            before = self.snapshot(instance)
            record_audit(
                actor=self.request.user,
                action=AuditAction.DELETE,
                obj=instance,
                before=before,
            )
            instance.delete()
