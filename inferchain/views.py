from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse


def spa_index(request: HttpRequest) -> HttpResponse:
    """The console SPA's index.html for any path the client-side router owns."""
    index = settings.FRONTEND_DIST / "index.html"
    if not index.exists():
        return HttpResponse(
            "The console is not built yet. Run `make run` (or `make frontend`) to build it.",
            status=503,
            content_type="text/plain",
        )
    return HttpResponse(index.read_bytes(), content_type="text/html; charset=utf-8")
