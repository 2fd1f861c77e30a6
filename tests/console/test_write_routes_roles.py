"""Every write route of /api/, read from the resolver, against the viewer and evaluator roles.

Viewers change nothing. Evaluators change evaluations and review marks only: never nodes, deployments,
keys, tenants, users, models, aliases, routing policies or rollouts. The table below is the domain's
rule, written out; the test fails when a write route appears that it does not place, and when a view
opts evaluators in (`evaluator_writable`) outside it. The per-object walks live in
tests/console/test_permissions.py, tests/registry/test_permissions.py and tests/evals/test_eval_roles.py;
this one covers every route, with parameters of objects that do not exist (roles are checked first).
"""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from tests.api_routes import Operation, api_operations, unlisted_api_patterns

pytestmark = pytest.mark.django_db

# Writes any signed-in role (or anyone) may make: they change no shared state.
OPEN_WRITES = {
    "POST /api/auth/login/",
    "POST /api/auth/logout/",
    "POST /api/fit-check/",  # a calculation; writes nothing
    # The agent channel: no role; the host's agent token is the credential (tests/nodes/test_agent_token.py).
    "POST /api/agent/sync/",
    "POST /api/agent/logs/",
}
# Where evaluators work: suites, cases, runs and their review marks, and shadow-pair marks.
EVALUATOR_PATHS = ("/api/eval-suites/", "/api/eval-suite-versions/", "/api/eval-cases/", "/api/eval-runs/")
EVALUATOR_WRITES = {"POST /api/shadow-pairs/{pk}/mark/", "DELETE /api/shadow-pairs/{pk}/mark/"}
# What the issue names: nodes, keys and policies (and everything else an admin owns).
ADMIN_ONLY_PATHS = (
    "/api/hosts/",
    "/api/deployments/",
    "/api/keys/",
    "/api/tenants/",
    "/api/users/",
    "/api/route-pools/",
    "/api/route-policies/",
    "/api/stage-chains/",
    "/api/rollouts/",
    "/api/shadow-configs/",
    "/api/models/",
    "/api/model-versions/",
    "/api/model-aliases/",
    "/api/quantization-configs/",
    "/api/model-stores/",
    "/api/alerts/",
    "/api/alert-rules/",
    "/api/baselines/",
    "/api/scaling-policies/",
)
ROLE_REFUSAL = "Your role does not allow this action."


def _evaluator_may(op: Operation) -> bool:
    return op.path.startswith(EVALUATOR_PATHS) or str(op) in EVALUATOR_WRITES


def _writes() -> list[Operation]:
    return [op for op in api_operations() if op.is_write and str(op) not in OPEN_WRITES]


def _call(client: APIClient, op: Operation) -> tuple[int, object]:
    resp = getattr(client, op.method.lower())(op.url(), {}, format="json")
    try:
        return resp.status_code, resp.json()
    except ValueError:
        return resp.status_code, resp.content


def test_the_route_list_is_complete_and_every_write_is_placed() -> None:
    assert unlisted_api_patterns() == []
    writes = _writes()
    assert len(writes) >= 80  # 81 when written; a collapse of the enumeration would show here
    for op in writes:
        admin_only = op.path.startswith(ADMIN_ONLY_PATHS)
        assert admin_only != _evaluator_may(op), f"{op}: place it in ADMIN_ONLY_PATHS or the evaluator table"
    # Every entry of the tables still names a route (a renamed route leaves no stale exception behind).
    names = {str(op) for op in api_operations()}
    assert names >= OPEN_WRITES | EVALUATOR_WRITES
    # The permission class lets evaluators write exactly where the table says.
    for op in writes:
        assert bool(getattr(op.view, "evaluator_writable", False)) == _evaluator_may(op), str(op)


def test_viewers_are_refused_every_write(viewer_client: APIClient) -> None:
    refused = 0
    for op in _writes():
        status, body = _call(viewer_client, op)
        assert status == 403, (str(op), status, body)
        assert body == {"detail": ROLE_REFUSAL}, (str(op), body)
        refused += 1
    assert refused == len(_writes())


def test_evaluators_are_refused_every_admin_write(evaluator_client: APIClient) -> None:
    admin_writes = [op for op in _writes() if not _evaluator_may(op)]
    assert len(admin_writes) >= 60
    for op in admin_writes:
        status, body = _call(evaluator_client, op)
        assert status == 403, (str(op), status, body)
        assert body == {"detail": ROLE_REFUSAL}, (str(op), body)


def test_evaluator_writes_get_past_the_role_check(evaluator_client: APIClient) -> None:
    """The other side of the rule: on their own routes evaluators meet the object lookup or the
    validation (404/400/405), never the role refusal; test_eval_roles.py walks them with real objects."""
    for op in _writes():
        if _evaluator_may(op):
            status, body = _call(evaluator_client, op)
            assert body != {"detail": ROLE_REFUSAL}, (str(op), status, body)
            assert status < 500, (str(op), status, body)


def test_anonymous_callers_are_refused_every_write(anon_client: APIClient) -> None:
    for op in _writes():
        status, _ = _call(anon_client, op)
        assert status == 401, (str(op), status)


def test_user_accounts_are_hidden_from_non_admins_even_to_read(
    viewer_client: APIClient, evaluator_client: APIClient
) -> None:
    reads = [op for op in api_operations() if op.path.startswith("/api/users/") and not op.is_write]
    assert reads
    for client in (viewer_client, evaluator_client):
        for op in reads:
            assert _call(client, op)[0] == 403, str(op)
