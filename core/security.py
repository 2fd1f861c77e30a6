"""The console's Content-Security-Policy header (docs/security.md).

One static policy, no nonces: the SPA is built by Vite into files served from this origin and has no
inline script, and Swagger UI's init script is served as a file too (`SpectacularSwaggerSplitView`). The
docs page alone allows inline styles (drf-spectacular's template carries a three-rule `<style>` block);
scripts stay `'self'` everywhere.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse

HEADER = "Content-Security-Policy"
DOCS_PREFIX = "/api/docs/"


def policy_for(path: str) -> str:
    policy: str = settings.CONTENT_SECURITY_POLICY
    if path.startswith(DOCS_PREFIX):
        directives = [d.strip() for d in policy.split(";") if d.strip()]
        directives = [
            f"{d} 'unsafe-inline'" if d.split()[0] == "style-src" and "'unsafe-inline'" not in d else d
            for d in directives
        ]
        policy = "; ".join(directives)
    return policy


class ContentSecurityPolicyMiddleware:
    """Adds the policy to every Django response that has none (an empty setting turns it off)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if settings.CONTENT_SECURITY_POLICY and HEADER not in response:
            response[HEADER] = policy_for(request.path)
        return response
