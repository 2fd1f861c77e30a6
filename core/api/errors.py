"""`/api/` errors are JSON in DRF's shape (`{"detail": ...}`), whatever raised them.

DRF views shape their own errors (`exception_handler`); what Django answers around them (no route, a
body too large to read, a CSRF or host refusal, a crash) would be an HTML page, which an API client
cannot read. `ApiJsonErrorsMiddleware` turns those into JSON for `/api/` paths only; the SPA and the
admin keep Django's pages.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.deprecation import MiddlewareMixin
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

log = logging.getLogger(__name__)
API_PREFIX = "/api/"
DATABASE_DOWN_DETAIL = (
    "The database is unavailable, so the console cannot read or change anything right now. "
    "Inference through the proxy keeps working; retry once the database is back."
)
DATABASE_DOWN_RETRY_AFTER_S = 5


def database_unavailable() -> JsonResponse:
    """A 503 the SPA recognises by its code (it shows a banner instead of a failed page)."""
    response = JsonResponse({"detail": DATABASE_DOWN_DETAIL, "code": "database_unavailable"}, status=503)
    response["Retry-After"] = str(DATABASE_DOWN_RETRY_AFTER_S)
    # Logged once as a WARNING where it is caught; without this Django adds an ERROR line per request
    # (django.request logs every 5xx), which would flood the log for the length of an outage.
    setattr(response, "_has_been_logged", True)  # noqa: B010
    return response


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

    A database that cannot be reached (OperationalError, InterfaceError) is a JSON 503 with code
    `database_unavailable` and Retry-After, not a 500.

    Django answers an oversized body (a SuspiciousOperation that DRF re-raises) with an HTML 400 and an
    ERROR traceback; it is the client's mistake, so it gets a 413 and one WARNING line. Listed first in
    MIDDLEWARE, so it sees what every other layer answered (CommonMiddleware's trailing-slash redirect
    is not an error and passes through); a crash is still logged with its traceback before this runs.
    """

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not request.path.startswith(API_PREFIX):
            return None
        if isinstance(exception, RequestDataTooBig):
            return JsonResponse({"detail": _detail(413)}, status=413)
        # A lost database is an outage to report, not a crash: one WARNING line instead of a traceback
        # per request, and an answer the SPA can show as such. Django drops the broken connection at the
        # end of the request, so the first request after the database returns reconnects.
        if isinstance(exception, (OperationalError, InterfaceError)):
            log.warning("api: database unavailable (%s): 503 for %s", exception, request.path)
            return database_unavailable()
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
