from __future__ import annotations

from rest_framework import serializers

from core.models import AuditEvent


class AuditEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditEvent
        fields = [
            "id",
            "actor",
            "actor_name",
            "action",
            "object_type",
            "object_id",
            "object_repr",
            "before",
            "after",
            "created_at",
        ]
        read_only_fields = fields
