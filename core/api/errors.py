from __future__ import annotations

from typing import Any

from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's handler; kept as the one place to shape `/api/` errors (field errors stay as DRF gives them)."""
    return drf_exception_handler(exc, context)
