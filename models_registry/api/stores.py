"""The model store agents fetch versions from: one active at a time, set by admins (docs/registry.md)."""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from rest_framework import serializers

from core.api.base import AuditedModelViewSet, StrictModelSerializer
from models_registry.choices import StoreKind
from models_registry.models import ModelStore

# S3 bucket names (AWS's rules, which S3-compatible services follow), then an optional key prefix.
BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/[^\s]*)?$")


def _is_http_url(value: str) -> bool:
    parts = urlsplit(value)
    return parts.scheme in ("http", "https") and bool(parts.hostname) and not parts.query


class ModelStoreSerializer(StrictModelSerializer):
    class Meta:
        model = ModelStore
        fields = [
            "id",
            "name",
            "kind",
            "location",
            "endpoint_url",
            "region",
            "is_active",
            "description",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["id", "created_at", "updated_at"]
        # The one-active constraint is kept by save() retiring the other store, not by refusing.
        extra_kwargs: dict[str, dict[str, Any]] = {"is_active": {"validators": []}}

    def validate(self, attrs: Any) -> Any:
        attrs = super().validate(attrs)

        def current(name: str) -> Any:
            return attrs.get(name, getattr(self.instance, name, ""))

        kind, location = current("kind"), current("location").strip()
        errors: dict[str, str] = {}
        if kind == StoreKind.DIRECTORY and not PurePosixPath(location).is_absolute():
            errors["location"] = (
                "A directory store needs an absolute path every agent can read (e.g. /mnt/models)."
            )
        elif kind == StoreKind.HTTP and not _is_http_url(location):
            errors["location"] = (
                "An HTTP store needs a base URL such as https://models.example.internal/store."
            )
        elif kind == StoreKind.S3 and not BUCKET.match(location):
            errors["location"] = (
                "An S3 store needs a bucket name, optionally with a prefix: my-bucket/models."
            )
        if kind != StoreKind.S3:
            for name in ("endpoint_url", "region"):
                if current(name):
                    errors[name] = "Only S3 stores take this; leave it blank."
        elif current("endpoint_url") and not _is_http_url(current("endpoint_url")):
            errors["endpoint_url"] = "Give the S3 endpoint as a URL, e.g. http://minio.internal:9000."
        if errors:
            raise serializers.ValidationError(errors)
        if "location" in attrs:
            attrs["location"] = location.rstrip("/") or location
        return attrs

    def save(self, **kwargs: Any) -> ModelStore:
        # One active store: activating this one retires the other (the view's transaction holds both).
        if self.validated_data.get("is_active"):
            others = ModelStore.objects.filter(is_active=True)
            if self.instance is not None:
                others = others.exclude(pk=self.instance.pk)
            others.update(is_active=False)
        return super().save(**kwargs)


class ModelStoreViewSet(AuditedModelViewSet):
    """Model stores: where agents fetch a version's files before a launch. Admins write; everyone reads."""

    serializer_class = ModelStoreSerializer
    queryset = ModelStore.objects.all()
    filterset_fields = ["kind", "is_active"]
    search_fields = ["name", "location", "description"]
