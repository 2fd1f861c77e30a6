from __future__ import annotations

import django_filters
from rest_framework import viewsets

from core.api.filters import UtcIsoDateTimeFilter
from core.api.serializers import AuditEventSerializer
from core.models import AuditEvent


class AuditEventFilter(django_filters.FilterSet):
    since = UtcIsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    until = UtcIsoDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = AuditEvent
        fields = ["action", "object_type", "object_id", "actor", "actor_name"]


class AuditEventViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = AuditEventSerializer
    queryset = AuditEvent.objects.all()
    filterset_class = AuditEventFilter
    search_fields = ["object_repr", "actor_name", "object_type"]
    ordering_fields = ["created_at"]
