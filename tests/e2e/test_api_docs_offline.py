"""/api/docs/ renders Swagger UI from the installed drf-spectacular-sidecar package: with every request
outside the loopback refused, the page still lists the API's operations."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import expect

from tests.e2e.harness import screenshot

pytestmark = pytest.mark.e2e

LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}


def test_docs_page_renders_operations_without_the_network(browser_page: Any) -> None:
    page = browser_page
    refused: list[str] = []

    def only_loopback(route: Any) -> None:
        url = route.request.url
        host = urlsplit(url).hostname or ""
        if url.startswith(("data:", "blob:")) or host in LOOPBACK:
            route.continue_()
        else:
            refused.append(url)
            route.abort()

    page.context.route("**/*", only_loopback)
    # Swagger UI renders only the operations near the viewport (a long schema renders a screenful, about
    # ten); a page tall enough for all of them lets the test see every app's operations at once.
    page.set_viewport_size({"width": 1280, "height": 20000})
    page.goto("/api/docs/")
    operations = page.locator(".swagger-ui .opblock")
    expect(operations.first).to_be_visible()
    # Operations of several apps are listed, with their paths.
    expect(operations.nth(20)).to_be_attached()
    for path in ("/api/deployments/{id}/logs/", "/api/keys/"):
        expect(page.locator(".opblock-summary-path", has_text=path).first).to_be_visible()
    screenshot(page, "api-docs-offline")
    assert refused == [], f"the docs page asked for outside resources: {refused}"
    # Swagger UI's own files came from this server (the sidecar's static files), not from a CDN.
    scripts = page.eval_on_selector_all("script[src]", "els => els.map(e => e.src)")
    assert scripts and all(urlsplit(src).hostname in LOOPBACK for src in scripts), scripts
    assert any("drf_spectacular_sidecar" in src for src in scripts), scripts
