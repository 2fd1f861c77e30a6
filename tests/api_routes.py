"""Every `/api/` operation, read from the URL resolver, so that tests walking all routes cannot miss one.

`api_operations()` lists each (method, path template, view) that DRF serves under /api/ (drf-spectacular's
EndpointEnumerator walks the resolver, as the schema does). `unlisted_api_patterns()` walks the resolver
again on its own and names any pattern under /api/ that the list does not cover (a plain Django view, a
route the enumerator skipped): tests assert it is empty, so a new kind of route fails them instead of
going untested.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django.urls import URLPattern, URLResolver, get_resolver
from drf_spectacular.generators import EndpointEnumerator
from rest_framework.routers import APIRootView
from rest_framework.views import APIView

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
PARAM = re.compile(r"\{([^}]+)\}")
# Parameters whose route accepts only some values (the rest of the path is then a 404 from the router).
FIXED_PARAMS = {"kind": "csv"}


@dataclass(frozen=True)
class Operation:
    method: str
    path: str  # a template: /api/keys/{pk}/revoke/
    view: type[APIView]
    action: str | None

    @property
    def is_write(self) -> bool:
        return self.method in WRITE_METHODS

    def url(self, value: str = "999999") -> str:
        """The path with every parameter filled (a missing object: role checks come before lookups)."""
        return PARAM.sub(lambda m: FIXED_PARAMS.get(m.group(1), value), self.path)

    def __str__(self) -> str:
        return f"{self.method} {self.path}"


def api_operations() -> list[Operation]:
    ops = []
    for path, _regex, method, callback in EndpointEnumerator().get_api_endpoints():
        if not path.startswith("/api/"):
            continue
        actions = getattr(callback, "actions", None) or {}
        ops.append(Operation(method, path, callback.cls, actions.get(method.lower())))
    return sorted(ops, key=lambda op: (op.path, op.method))


def _leaves(patterns: list[Any], prefix: str = "") -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            found.extend(_leaves(pattern.url_patterns, route))
        elif isinstance(pattern, URLPattern):
            found.append((route, pattern.callback))
    return found


def unlisted_api_patterns() -> list[str]:
    """Patterns under /api/ served by something `api_operations()` does not list."""
    listed = {op.view for op in api_operations()}
    missing = []
    for route, callback in _leaves(get_resolver().url_patterns):
        if not route.lstrip("^").startswith("api/"):
            continue
        cls = getattr(callback, "cls", None)
        if cls is not None and issubclass(cls, APIRootView):
            continue  # the routers' index pages: links to the routes below, nothing else
        if cls is None or cls not in listed:
            missing.append(route)
    return missing
