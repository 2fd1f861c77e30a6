"""In Chromium: every console page (read from frontend/src/routes.tsx, so a new page is covered) and the
API docs page load under the Content-Security-Policy without one violation; a session POST without the
CSRF token is refused; and the login page says when sign-in is throttled."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from console.models import Tenant, User
from nodes.models import Deployment, Host
from routing.models import StageChain
from tests.conftest import PASSWORD
from tests.e2e.harness import REPO_ROOT, login, screenshot
from tests.evals.review_helpers import finished_run, version_pair

pytestmark = pytest.mark.e2e

ROUTES = REPO_ROOT / "frontend" / "src" / "routes.tsx"
# Collected in the page before any of its own scripts run; Chromium also logs each refusal.
LISTEN = """
window.__cspViolations = [];
document.addEventListener('securitypolicyviolation', (e) => {
  const where = `${e.sourceFile}:${e.lineNumber}`;
  window.__cspViolations.push(`${e.violatedDirective} blocked ${e.blockedURI} at ${where}`);
});
"""


def _console_paths() -> list[str]:
    return re.findall(r'\{\s*path:\s*"([^"]*)"', ROUTES.read_text())


def _fill(path: str, ids: dict[str, str]) -> str:
    """A real object for each `:param` (the page renders its data, not a 'not found')."""
    for prefix, value in ids.items():
        if path.startswith(prefix):
            return "/" + re.sub(r":\w+", value, path)
    assert ":" not in path, f"no object for the console page {path!r}: add one to the test"
    return "/" + path


def _objects() -> dict[str, str]:
    _parent, child = version_pair("csp-model")
    host = Host.objects.create(name="csp-host", address="127.0.0.1")
    deployment = Deployment.objects.create(
        name="csp-dep",
        model_version=child,
        host=host,
        port=18650,
        served_model_name="m",
        state="ready",
        start_token="t",
        engine="sim",
    )
    run = finished_run(candidate=child, suite_name="csp-suite")
    return {
        "nodes/deployments/": str(deployment.pk),
        "models/versions/": str(child.pk),
        "rollouts/shadow/": "csp-alias",
        "tenants/": str(Tenant.objects.create(name="csp-tenant").pk),
        "evaluations/suites/": str(run.suite_version.suite_id),
        "evaluations/runs/": str(run.pk),
        "routing/chains/": str(
            StageChain.objects.create(
                name="csp-chain",
                alias="m",
                stages=[{"kind": "guard", "config": {"terms": ["x"]}}, {"kind": "generate"}],
            ).pk
        ),
    }


def test_every_console_page_passes_the_content_security_policy(
    browser_page: Any, admin_user: User, tmp_path: Path
) -> None:
    page = browser_page
    console_errors: list[str] = []
    page.on(
        "console",
        lambda msg: (
            console_errors.append(msg.text)
            if msg.type == "error" and "Content Security Policy" in msg.text
            else None
        ),
    )
    page.context.add_init_script(LISTEN)
    ids = _objects()
    paths = _console_paths()
    assert len(paths) >= 19 and "" in paths and "tenants/:id" in paths
    login(page, admin_user.username, PASSWORD)
    visited = []
    for path in ["/login", *(_fill(p, ids) for p in paths), "/no-such-page"]:
        page.goto(path)
        page.wait_for_load_state("networkidle")
        if path != "/login":
            expect(page.get_by_test_id("current-user")).to_contain_text(admin_user.username)
        violations = page.evaluate("window.__cspViolations")
        assert violations == [], (path, violations)
        visited.append(path)
    assert console_errors == [], console_errors
    assert len(visited) == len(paths) + 2

    # The API docs (Swagger UI from the sidecar package, its init script a file) run under it too.
    page.set_viewport_size({"width": 1280, "height": 4000})
    page.goto("/api/docs/")
    expect(page.locator(".swagger-ui .opblock").first).to_be_visible()
    assert page.evaluate("window.__cspViolations") == []
    policy = page.evaluate("async () => (await fetch('/tenants')).headers.get('content-security-policy')")
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy
    screenshot(page, "api-docs-under-csp")

    # A session write without the CSRF token is refused, with the session cookie the browser holds.
    status = page.evaluate(
        """async () => (await fetch('/api/tenants/', {
            method: 'POST', headers: {'Content-Type': 'application/json'},
            body: JSON.stringify({name: 'no-csrf'}),
        })).status"""
    )
    assert status == 403
    assert not Tenant.objects.filter(name="no-csrf").exists()


@pytest.mark.usefixtures("redis_clean")
def test_the_login_page_says_when_sign_in_is_throttled(browser_page: Any, admin_user: User) -> None:
    page = browser_page
    page.goto("/login")
    for _ in range(5):  # LOGIN_MAX_FAILURES_PER_USERNAME's default
        page.get_by_label("Username").fill(admin_user.username)
        page.get_by_label("Password").fill("not-the-password")
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_text("Wrong username or password.")).to_be_visible()
        expect(page.get_by_role("button", name="Sign in")).to_be_enabled()
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(
        page.get_by_text(
            re.compile(r"Too many failed sign-ins from this username\. Try again in \d+ seconds\.")
        )
    ).to_be_visible()
    expect(page.get_by_role("heading", name="Sign in to the console")).to_be_visible()
    screenshot(page, "login-throttled")
