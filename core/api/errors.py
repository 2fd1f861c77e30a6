"""`/api/` errors are JSON in DRF's shape (`{"detail": ...}`), whatever raised them.

DRF views shape their own errors (`exception_handler`); what Django answers around them (no route, a
body too large to read, a CSRF or host refusal, a crash) would be an HTML page, which an API client
cannot read. `ApiJsonErrorsMiddleware` turns those into JSON for `/api/` paths only; the SPA and the
admin keep Django's pages.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.deprecation import MiddlewareMixin
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

API_PREFIX = "/api/"


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's handler; kept as the one place to shape `/api/` errors (field errors stay as DRF gives them)."""
    return drf_exception_handler(exc, context)


def _detail(status_code: int) -> str:
    if status_code == 404:
        return str(exceptions.NotFound.default_detail)
    if status_code == 413:
        return f"Request body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes."
    if status_code >= 500:
        return str(exceptions.APIException.default_detail)
    try:
        return HTTPStatus(status_code).phrase + "."
    except ValueError:
        return "Error."


class ApiJsonErrorsMiddleware(MiddlewareMixin):
    """Under `/api/`: a body over DATA_UPLOAD_MAX_MEMORY_SIZE is a JSON 413, and any other non-JSON
    error page becomes DRF's JSON shape with the same status.

    Django answers an oversized body (a SuspiciousOperation that DRF re-raises) with an HTML 400 and an
    ERROR traceback; it is the client's mistake, so it gets a 413 and one WARNING line. Listed first in
    MIDDLEWARE, so it sees what every other layer answered (CommonMiddleware's trailing-slash redirect
    is not an error and passes through); a crash is still logged with its traceback before this runs.
    """

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if isinstance(exception, RequestDataTooBig) and request.path.startswith(API_PREFIX):
            return JsonResponse({"detail": _detail(413)}, status=413)
        return None

    def process_response(self, request: HttpRequest, response: HttpResponse) -> HttpResponse:
        if (
            response.status_code < 400
            or not request.path.startswith(API_PREFIX)
            or response.get("Content-Type", "").startswith("application/json")
        ):
            return response
        replaced = JsonResponse({"detail": _detail(response.status_code)}, status=response.status_code)
        for name in ("Allow", "WWW-Authenticate", "Retry-After"):
            if name in response:
                replaced[name] = response[name]
        return replaced
