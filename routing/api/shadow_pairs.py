"""Shadow pairs for review: the mirrored requests of an alias, each with both answers and their scores.

Everyone signed in reads (the prompts are tenants' data, but only consenting tenants are mirrored);
evaluators and admins mark, as they mark an offline run's samples (console.permissions). The list is
always paginated: pairs pile up at the mirrored percentage of live traffic. Marks go through
routing.rollouts.review, which audits them.
"""

from __future__ import annotations

from typing import Any

import django_filters
from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from core.api.base import StrictSerializerMixin
from models_registry.evaluation.models import SampleMark
from models_registry.models import ModelVersion
from routing.models import ShadowPair
from routing.rollouts.review import clear_pair_mark, mark_pair

MARK_FILTERS = ("any", "none", *SampleMark.values)


@extend_schema_field(
    {
        "type": "array",
        "nullable": True,
        "items": {
            "type": "object",
            "properties": {"role": {"type": "string"}, "content": {}},
            "additionalProperties": True,
        },
    }
)
class MessagesField(serializers.JSONField):
    pass


class ShadowPairSerializer(serializers.ModelSerializer):
    # The request as the client sent it stays in `request`; these two are what the review view shows.
    prompt = serializers.SerializerMethodField()
    messages = serializers.SerializerMethodField()
    primary_version_label = serializers.SerializerMethodField()
    candidate_version_label = serializers.SerializerMethodField()

    class Meta:
        model = ShadowPair
        fields = [
            "id",
            "created_at",
            "request_id",
            "alias",
            "tenant_id",
            "endpoint_kind",
            "primary_version_id",
            "primary_version_label",
            "candidate_version_id",
            "candidate_version_label",
            "prompt",
            "messages",
            "request",
            "primary_output",
            "candidate_output",
            "primary_latency_ms",
            "candidate_latency_ms",
            "candidate_status",
            "candidate_error",
            "exact_match",
            "first_divergence",
            "chrf",
            "scores",
            "mark",
            "comment",
            "marked_by_name",
            "marked_at",
        ]
        read_only_fields = fields

    def get_prompt(self, obj: ShadowPair) -> str | None:
        prompt = (obj.request or {}).get("prompt")
        return prompt if isinstance(prompt, str) else None

    @extend_schema_field(MessagesField)
    def get_messages(self, obj: ShadowPair) -> list[Any] | None:
        messages = (obj.request or {}).get("messages")
        return messages if isinstance(messages, list) else None

    def _label(self, version_id: int | None) -> str:
        if version_id is None:
            return ""
        labels: dict[int, str] = self.context.get("version_labels") or {}
        return labels.get(version_id) or str(version_id)

    def get_primary_version_label(self, obj: ShadowPair) -> str:
        return self._label(obj.primary_version_id)

    def get_candidate_version_label(self, obj: ShadowPair) -> str:
        return self._label(obj.candidate_version_id)


class StrictBooleanFilter(django_filters.ChoiceFilter):
    """ "true" or "false", anything else a field error (django-filter's BooleanFilter ignores a typo).
    Its method gets the string."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, choices=[("true", "true"), ("false", "false")], **kwargs)


class ShadowPairFilter(django_filters.FilterSet):
    alias = django_filters.CharFilter(field_name="alias", help_text="the alias's name")
    candidate_version = django_filters.NumberFilter(field_name="candidate_version_id")
    differs = StrictBooleanFilter(
        method="filter_differs", help_text="only pairs whose two answers differ (or are the same)"
    )
    failed = StrictBooleanFilter(
        method="filter_failed", help_text="only pairs whose candidate failed (or answered)"
    )
    marked = django_filters.ChoiceFilter(
        method="filter_marked",
        choices=[(m, m) for m in MARK_FILTERS],
        help_text="by review mark: any, none, or one mark",
    )

    class Meta:
        model = ShadowPair
        fields = ["alias", "candidate_version", "differs", "failed", "marked"]

    def filter_differs(self, qs: QuerySet[ShadowPair], name: str, value: str) -> QuerySet[ShadowPair]:
        # A failed pair has no score (exact_match null): it neither differs nor agrees.
        return qs.filter(exact_match=value != "true")

    def filter_failed(self, qs: QuerySet[ShadowPair], name: str, value: str) -> QuerySet[ShadowPair]:
        return qs.exclude(candidate_error="") if value == "true" else qs.filter(candidate_error="")

    def filter_marked(self, qs: QuerySet[ShadowPair], name: str, value: str) -> QuerySet[ShadowPair]:
        if value == "any":
            return qs.exclude(mark="")
        if value == "none":
            return qs.filter(mark="")
        return qs.filter(mark=value)


class PairMarkSerializer(StrictSerializerMixin, serializers.Serializer):
    mark = serializers.ChoiceField(choices=SampleMark.choices)
    comment = serializers.CharField(required=False, allow_blank=True, default="", max_length=5000)


class ShadowPairViewSet(viewsets.ReadOnlyModelViewSet):
    """Mirrored pairs, newest first: filter by alias, candidate, differs, failed, marked; order by
    created_at or chrf (lowest first: the most different)."""

    serializer_class = ShadowPairSerializer
    filterset_class = ShadowPairFilter
    ordering_fields = ["created_at", "chrf"]
    search_fields: list[str] = []
    evaluator_writable = True  # the mark action; everything else here is a read

    def get_queryset(self) -> QuerySet[ShadowPair]:
        return ShadowPair.objects.order_by("-created_at", "-id")

    def get_serializer_context(self) -> dict[str, Any]:
        return {**super().get_serializer_context(), "version_labels": getattr(self, "_labels", {})}

    def _load_labels(self, pairs: Any) -> None:
        """The versions' labels of these pairs, in one query (the pair stores bare version ids)."""
        ids = {i for p in pairs for i in (p.primary_version_id, p.candidate_version_id) if i is not None}
        self._labels = {v.pk: str(v) for v in ModelVersion.objects.filter(pk__in=ids).select_related("model")}

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        rows = self.filter_queryset(self.get_queryset())
        page = self.paginate_queryset(rows)
        assert page is not None  # always paginated (settings' LimitOffsetPagination)
        self._load_labels(page)
        return self.get_paginated_response(self.get_serializer(page, many=True).data)

    def _one(self, pair: ShadowPair) -> Response:
        self._load_labels([pair])
        return Response(self.get_serializer(pair).data)

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return self._one(self.get_object())

    @extend_schema(methods=["POST"], request=PairMarkSerializer, responses={200: ShadowPairSerializer})
    @extend_schema(methods=["DELETE"], request=None, responses={200: ShadowPairSerializer})
    @action(detail=True, methods=["post", "delete"], filter_backends=[])
    def mark(self, request: Request, pk: str | None = None) -> Response:
        """Mark the pair same / acceptable / regression with a comment (replacing its mark), or DELETE
        the mark. Answers the pair."""
        pair = self.get_object()
        if request.method == "DELETE":
            clear_pair_mark(pair, actor=request.user)
        else:
            body = PairMarkSerializer(data=request.data)
            body.is_valid(raise_exception=True)
            mark_pair(pair, body.validated_data["mark"], body.validated_data["comment"], actor=request.user)
        pair.refresh_from_db()
        return self._one(pair)
