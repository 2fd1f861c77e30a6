"""Only admins deploy: an evaluator (who may start evaluation runs and sign them off) and a viewer are
refused every deployment write, and an alias switch (which changes what tenants are served); nothing
changes and nothing is queued."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from core.models import AuditEvent
from models_registry.models import ModelAlias, ModelVersion
from nodes.choices import DeploymentState, DesiredState
from nodes.models import Deployment, Host

pytestmark = pytest.mark.django_db


def deploy_calls(host: Host, version: ModelVersion, deployment: Deployment, alias: ModelAlias) -> list[Any]:
    url = f"/api/deployments/{deployment.pk}"
    new = {
        "name": "by-evaluator",
        "model_version": version.pk,
        "engine": "sim",
        "host": host.pk,
        "gpu_indices": [0],
        "port": 18556,
        "served_model_name": "llama-3.1-8b",
        "max_model_len": 4096,
    }
    return [
        ("post", "/api/deployments/", new),
        ("post", "/api/deployments/preflight/", {k: v for k, v in new.items() if k != "name"}),
        ("post", f"{url}/start/", {}),
        ("post", f"{url}/stop/", {"drain": False}),
        ("post", f"{url}/drain/", {}),
        ("post", f"{url}/restart/", {}),
        ("patch", f"{url}/", {"max_num_seqs": 8}),
        ("delete", f"{url}/", None),
        ("post", f"/api/model-aliases/{alias.pk}/switch/", {"version": version.pk}),
    ]


@pytest.mark.parametrize("role_client", ["evaluator_client", "viewer_client"])
def test_only_admins_deploy(
    role_client: str,
    request: pytest.FixtureRequest,
    host: Host,
    llama_version: ModelVersion,
    make_deployment: Any,
    redis_clean: None,
) -> None:
    client: APIClient = request.getfixturevalue(role_client)
    deployment = make_deployment(state=DeploymentState.READY, desired_state=DesiredState.RUNNING)
    other = ModelVersion.objects.create(
        model=llama_version.model, revision="other", source_kind="directory", source_path="/m/other"
    )
    alias = ModelAlias.objects.create(name="llama", active_version=other)
    audited = AuditEvent.objects.count()  # the version's registration
    for method, url, body in deploy_calls(host, llama_version, deployment, alias):
        status = getattr(client, method)(url, body, format="json").status_code
        assert status == 403, (method, url, status)
    assert list(Deployment.objects.values_list("pk", "state", "desired_state", "max_num_seqs")) == [
        (deployment.pk, DeploymentState.READY, DesiredState.RUNNING, 16)
    ]
    assert ModelAlias.objects.get(pk=alias.pk).active_version_id == other.pk
    assert AuditEvent.objects.count() == audited
    # Reading the fleet is allowed.
    assert client.get("/api/deployments/").status_code == 200
    assert client.get(f"/api/deployments/{deployment.pk}/").status_code == 200


def test_the_same_calls_pass_the_role_check_for_an_admin(
    admin_client: APIClient, host: Host, llama_version: ModelVersion, make_deployment: Any, redis_clean: None
) -> None:
    """The refusals above are the role's, not the calls': an admin gets past the permission check."""
    deployment = make_deployment(state=DeploymentState.STOPPED, desired_state=DesiredState.STOPPED)
    alias = ModelAlias.objects.create(name="llama", active_version=llama_version)
    for method, url, body in deploy_calls(host, llama_version, deployment, alias):
        status = getattr(admin_client, method)(url, body, format="json").status_code
        assert status not in (401, 403), (method, url, status)
