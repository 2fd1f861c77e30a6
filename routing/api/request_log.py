"""The request-log explorer's filters and the names it shows for the ids the log keeps.

Every filter maps to an index of the partitioned table (routing/models.py RequestLog.Meta.indexes):
a request id is one probe of `reqlog_request_id` per day partition, a key is `reqlog_key_created`
(newest first), so "find this request" and "what did this key do" cost the same on a month of log as
on an hour. The log keeps plain ids (it outlives the rows it names); the names of deployments, model
versions and keys are looked up per page, in one query each, not per row.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import django_filters
from django import forms
from django.db.models import QuerySet
from rest_framework.exceptions import ValidationError

from console.models import ApiKey
from core.api.filters import UtcIsoDateTimeFilter
from models_registry.models import ModelVersion
from nodes.models import Deployment
from routing.models import RequestLog

REQUEST_ID_MAX = RequestLog._meta.get_field("request_id").max_length or 40
KEY_PREFIX_MAX = RequestLog._meta.get_field("key_prefix").max_length or 16
REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]+$")
# An answer replayed by a cache stage carries the request id in its body's id ("chatcmpl-<request id>").
ANSWER_ID = re.compile(r"^(?:chatcmpl|cmpl)-(.+)$")

Rows = QuerySet[RequestLog]


class RequestIdField(forms.CharField):
    """A request id as a client has it (the `x-request-id` header of a `/v1/` answer), spaces trimmed."""

    def to_python(self, value: Any) -> str:
        text = super().to_python(value)
        if not text:
            return ""
        if len(text) > REQUEST_ID_MAX + len("chatcmpl-") or not REQUEST_ID.match(text):
            raise forms.ValidationError(
                f"Not a request id: give the x-request-id header of a /v1/ answer (up to {REQUEST_ID_MAX} "
                "letters, digits, '-', '_', '.' or ':').",
                code="invalid",
            )
        return text


class KeyPrefixField(forms.CharField):
    """A key's visible prefix. Never echoes what it was given: a whole key pasted here must not come back
    in an error message (or reach a log through one)."""

    def to_python(self, value: Any) -> str:
        text = super().to_python(value) or ""
        if len(text) > KEY_PREFIX_MAX:
            raise forms.ValidationError(
                f"Give the key's prefix as the console lists it (at most {KEY_PREFIX_MAX} characters), "
                "never the whole key; or filter by key_id.",
                code="invalid",
            )
        return text


class KeyIdField(forms.IntegerField):
    default_error_messages = {
        "invalid": "Must be the id of an API key (a whole number), as /api/keys/ lists it.",
        "min_value": "Must be the id of an API key (1 or more).",
        "max_value": "No API key has an id that large.",
    }

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(min_value=1, max_value=2**63 - 1, **kwargs)


class RequestIdFilter(django_filters.CharFilter):
    field_class = RequestIdField


class KeyPrefixFilter(django_filters.CharFilter):
    field_class = KeyPrefixField


class KeyIdFilter(django_filters.Filter):
    field_class = KeyIdField


class RequestLogFilter(django_filters.FilterSet):
    request_id = RequestIdFilter(
        method="filter_request_id",
        help_text="One request by its id (the x-request-id header of its answer); exact match, indexed.",
    )
    key_id = KeyIdFilter(
        method="filter_key_id",
        help_text="Requests made with this API key (its id in /api/keys/); never the key itself.",
    )
    key_prefix = KeyPrefixFilter(
        help_text="Requests made with keys of this visible prefix (a key deleted since still matches)."
    )
    since = UtcIsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    until = UtcIsoDateTimeFilter(field_name="created_at", lookup_expr="lt")
    status_min = django_filters.NumberFilter(field_name="status", lookup_expr="gte")
    status_max = django_filters.NumberFilter(field_name="status", lookup_expr="lte")

    class Meta:
        model = RequestLog
        fields = ["tenant_id", "alias", "status", "deployment_id", "model_version_id", "error_type", "stream"]

    def filter_request_id(self, queryset: Rows, name: str, value: str) -> Rows:
        if not value:
            return queryset
        answer = ANSWER_ID.match(value)
        if answer is None:
            return queryset.filter(request_id=value)
        return queryset.filter(request_id__in=[value, answer[1]])

    def filter_key_id(self, queryset: Rows, name: str, value: int | None) -> Rows:
        if value is None:
            return queryset
        key = ApiKey.objects.filter(pk=value).values("prefix", "tenant_id").first()
        if key is None:
            # A filter that names nothing would answer "no requests", which reads as "this key was idle".
            raise ValidationError({"key_id": [f"No API key with id {value}; /api/keys/ lists them."]})
        # Prefixes are short and may repeat across tenants: the key's tenant makes the match exact.
        return queryset.filter(key_prefix=key["prefix"], tenant_id=key["tenant_id"])


@dataclass
class LogNames:
    """Names for the ids one page of the log mentions; an id whose row is gone has no name."""

    deployments: dict[int, str] = field(default_factory=dict)
    versions: dict[int, str] = field(default_factory=dict)
    keys: dict[tuple[int | None, str], tuple[int, str]] = field(default_factory=dict)

    @classmethod
    def of(cls, rows: list[RequestLog]) -> LogNames:
        """At most three queries, whatever the number of rows."""
        names = cls()
        deployments = {r.deployment_id for r in rows if r.deployment_id is not None}
        versions = {r.model_version_id for r in rows if r.model_version_id is not None}
        prefixes = {r.key_prefix for r in rows if r.key_prefix}
        if deployments:
            names.deployments = dict(Deployment.objects.filter(pk__in=deployments).values_list("pk", "name"))
        if versions:
            names.versions = {
                pk: f"{model}@{revision}"
                for pk, model, revision in ModelVersion.objects.filter(pk__in=versions).values_list(
                    "pk", "model__name", "revision"
                )
            }
        if prefixes:
            names.keys = {
                (tenant, prefix): (pk, name)
                for pk, name, prefix, tenant in ApiKey.objects.filter(prefix__in=prefixes).values_list(
                    "pk", "name", "prefix", "tenant_id"
                )
            }
        return names
