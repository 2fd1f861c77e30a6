"""/api/scaling-policies/: created and edited by admins, refused with field errors when it cannot work
(bounds, no host of the pool's role, a template that fits nowhere), and its decisions listed."""

from __future__ import annotations

from typing import Any

import pytest

from core.models import AuditEvent
from nodes.choices import DeploymentState
from nodes.models import Deployment, Gpu, Host
from routing.models import RoutePool
from routing.scaling import autoscaler
from routing.scaling.models import ScalingPolicy
from tests.nodes.scaling_helpers import ROLE, at, set_live

pytestmark = pytest.mark.django_db


@pytest.fixture
def template(host: Host, make_deployment: Any, node_settings: Any, redis_clean: None) -> Deployment:
    # Hosts stay reachable through the test however slow the machine (the lost-host test ages one).
    node_settings.NODE_UNREACHABLE_SECONDS = 3600
    Host.objects.filter(pk=host.pk).update(role=ROLE)
    return make_deployment(role=ROLE, state=DeploymentState.READY, gpu_memory_utilization=0.3)


@pytest.fixture
def pool(template: Deployment) -> RoutePool:
    return RoutePool.objects.create(name="fast", alias=template.served_model_name, role=ROLE)


def body(pool: RoutePool, template: Deployment, **fields: Any) -> dict[str, Any]:
    return {"pool": pool.pk, "template": template.pk, "min_engines": 1, "max_engines": 3, **fields}


def test_admin_creates_a_policy_and_reads_its_engines(
    admin_client: Any, pool: RoutePool, template: Deployment
) -> None:
    response = admin_client.post("/api/scaling-policies/", body(pool, template), format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["pool_name"] == "fast" and data["template_name"] == template.name
    assert data["engines"] == {"serving": 1, "starting": 0, "draining": 0}
    assert AuditEvent.objects.filter(object_type="routing.scalingpolicy", action="create").exists()


@pytest.mark.parametrize(
    ("fields", "field", "text"),
    [
        ({"min_engines": 3, "max_engines": 2}, "max_engines", "at least min_engines (3)"),
        ({"min_engines": 0}, "min_engines", "At least 1"),
    ],
)
def test_bad_bounds_are_refused(
    admin_client: Any, pool: RoutePool, template: Deployment, fields: dict[str, Any], field: str, text: str
) -> None:
    response = admin_client.post("/api/scaling-policies/", body(pool, template, **fields), format="json")
    assert response.status_code == 400
    assert text in " ".join(response.json()[field])
    assert not ScalingPolicy.objects.exists()


def test_a_pool_with_no_host_of_its_role_is_refused(admin_client: Any, template: Deployment) -> None:
    lonely = RoutePool.objects.create(name="long", alias=template.served_model_name, role="long-context")
    response = admin_client.post("/api/scaling-policies/", body(lonely, template), format="json")
    assert response.status_code == 400
    assert "No host has the role 'long-context'" in response.json()["pool"][0]


def test_a_template_that_fits_no_host_is_refused(
    admin_client: Any, pool: RoutePool, template: Deployment
) -> None:
    # 4 GiB GPUs: the 8B model's 16 GB of weights fit on none.
    Gpu.objects.update(memory_total_bytes=4 * 1024**3)
    response = admin_client.post("/api/scaling-policies/", body(pool, template), format="json")
    assert response.status_code == 400
    assert "fit check fails on every host" in response.json()["template"][0]


def test_an_edit_is_checked_against_the_stored_values(
    admin_client: Any, pool: RoutePool, template: Deployment
) -> None:
    policy = ScalingPolicy.objects.create(pool=pool, template=template, min_engines=2, max_engines=3)
    response = admin_client.patch(f"/api/scaling-policies/{policy.pk}/", {"max_engines": 1}, format="json")
    assert response.status_code == 400 and "max_engines" in response.json()
    response = admin_client.patch(
        f"/api/scaling-policies/{policy.pk}/", {"max_engines": 5, "scale_up_cooldown_s": 15}, format="json"
    )
    assert response.status_code == 200, response.content
    policy.refresh_from_db()
    assert (policy.max_engines, policy.scale_up_cooldown_s) == (5, 15)


def test_decisions_are_listed_newest_first_for_everyone(
    admin_client: Any, viewer_client: Any, pool: RoutePool, template: Deployment
) -> None:
    policy = ScalingPolicy.objects.create(pool=pool, template=template, max_engines=3)
    set_live(template, waiting=9, running=8)
    assert autoscaler.evaluate(policy.pk, now=at(0)) is not None
    response = viewer_client.get(f"/api/scaling-policies/{policy.pk}/decisions/")
    assert response.status_code == 200
    [row] = response.json()
    assert row["action"] == "scale_up" and row["engines_after"] == 2
    assert row["metrics"]["waiting_per_engine"] == 9.0
    viewed = viewer_client.get(f"/api/scaling-policies/{policy.pk}/").json()
    assert viewed["last_target_engines"] == 2 and viewed["engines"]["starting"] == 1
    assert viewer_client.patch(f"/api/scaling-policies/{policy.pk}/", {"enabled": False}).status_code == 403
