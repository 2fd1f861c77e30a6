"""Filters shared by the API's list views."""

from __future__ import annotations

import datetime as dt
from typing import Any

import django_filters
from django import forms
from django_filters.fields import IsoDateTimeField


class UtcIsoDateTimeField(IsoDateTimeField):
    """An ISO 8601 date-time, converted to UTC before it reaches the database.

    Python accepts UTC offsets up to ±23:59, PostgreSQL only up to ±15:59: `?since=...+22:14` passed the
    form and failed in the query as a 500 (found by tests/console/test_api_fuzz.py). In UTC any offset is
    fine; a value that leaves the representable range once converted is a 400.
    """

    def to_python(self, value: Any) -> dt.datetime | None:
        parsed = super().to_python(value)
        if parsed is None or parsed.tzinfo is None:
            return parsed
        try:
            return parsed.astimezone(dt.UTC)
        except OverflowError:
            raise forms.ValidationError("Enter a date-time within years 1 to 9999.", code="invalid") from None


class UtcIsoDateTimeFilter(django_filters.IsoDateTimeFilter):
    field_class = UtcIsoDateTimeField
