"""How the OpenAPI schema (and so the console's generated TypeScript types) describes responses."""

from __future__ import annotations

from typing import Any

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import force_instance
from rest_framework import serializers


class ResponseFieldsAutoSchema(AutoSchema):
    """drf-spectacular's AutoSchema, with every readable field of a model serializer required in responses.

    A ModelSerializer renders each of its fields for every object, including the ones a client may leave
    out when writing (they have model defaults). Marking them required in the response schema lets the
    generated types say `name: string` instead of `name?: string`. Plain serializers that describe a JSON
    document keep DRF's own `required` flags: their optional keys may really be absent.
    """

    def _map_basic_serializer(self, serializer: Any, direction: str) -> dict[str, Any]:
        schema: dict[str, Any] = super()._map_basic_serializer(serializer, direction)
        instance = force_instance(serializer)
        if direction == "response" and isinstance(instance, serializers.ModelSerializer):
            properties = schema.get("properties", {})
            readable = {name for name, field in instance.fields.items() if not field.write_only}
            schema["required"] = sorted(set(schema.get("required", [])) | (readable & set(properties)))
        return schema
