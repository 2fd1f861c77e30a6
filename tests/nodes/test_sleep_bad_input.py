"""Sleep settings and actions refused with the reason, nothing half-written: an engine without sleep
mode (llama.cpp), a level other than 1 or 2, sleeping what is not ready, waking what is not asleep."""

from __future__ import annotations

from typing import Any

import pytest

from core.models import AuditEvent
from nodes.choices import DeploymentState
from nodes.models import Deployment
from routing.models import RoutePool

pytestmark = pytest.mark.django_db
SLEEP_ARGV = ["python", "-m", "vllm_sim", "serve", "m", "--enable-sleep-mode"]


def _body(version: Any, host: Any, **extra: Any) -> dict[str, Any]:
    return {
        "name": "d",
        "model_version": version.pk,
        "engine": "sim",
        "host": host.pk,
        "gpu_indices": [0],
        "port": 18555,
        "served_model_name": "llama-3.1-8b",
        "max_model_len": 4096,
        **extra,
    }


def test_llamacpp_cannot_sleep(admin_client: Any, llama_version: Any, host: Any) -> None:
    r = admin_client.post(
        "/api/deployments/",
        _body(llama_version, host, engine="llamacpp", sleep_idle_seconds=60),
        format="json",
    )
    assert r.status_code == 400 and "no sleep mode" in r.json()["sleep_idle_seconds"][0]
    assert not Deployment.objects.exists()


def test_level_must_be_1_or_2(admin_client: Any, llama_version: Any, host: Any) -> None:
    r = admin_client.post("/api/deployments/", _body(llama_version, host, sleep_level=3), format="json")
    assert r.status_code == 400 and "sleep_level" in r.json()
    assert not Deployment.objects.exists()


def test_idle_sleep_turns_sleep_mode_on(
    admin_client: Any, llama_version: Any, host: Any, django_capture_on_commit_callbacks: Any
) -> None:
    r = admin_client.post(
        "/api/deployments/", _body(llama_version, host, sleep_idle_seconds=60), format="json"
    )
    assert r.status_code == 201, r.content
    assert r.json()["sleep_enabled"] is True and r.json()["sleep_level"] == 1


def test_sleep_and_wake_actions_refused_with_reason(admin_client: Any, make_deployment: Any) -> None:
    plain = make_deployment(state=DeploymentState.READY)
    r = admin_client.post(f"/api/deployments/{plain.pk}/sleep/", {"level": 1}, format="json")
    assert r.status_code == 400 and "sleep_enabled" in r.json()
    llama = make_deployment(engine="llamacpp", state=DeploymentState.READY, sleep_enabled=True)
    r = admin_client.post(f"/api/deployments/{llama.pk}/sleep/", {}, format="json")
    assert r.status_code == 400 and "engine" in r.json()
    restart_first = make_deployment(state=DeploymentState.READY, sleep_enabled=True)  # started without it
    r = admin_client.post(f"/api/deployments/{restart_first.pk}/sleep/", {}, format="json")
    assert r.status_code == 400 and "restart" in r.json()["sleep_enabled"][0]
    able = make_deployment(state=DeploymentState.READY, sleep_enabled=True, launch_argv=SLEEP_ARGV)
    r = admin_client.post(f"/api/deployments/{able.pk}/sleep/", {"level": 5}, format="json")
    assert r.status_code == 400 and "level" in r.json()
    r = admin_client.post(f"/api/deployments/{able.pk}/wake/", {}, format="json")
    assert r.status_code == 400 and "state" in r.json()
    assert not AuditEvent.objects.filter(after__action__in=["sleep", "wake"]).exists()


def test_sleep_action_is_audited_and_queued(
    admin_client: Any, make_deployment: Any, redis_clean: None, django_capture_on_commit_callbacks: Any
) -> None:
    from tests.nodes.test_deployment_actions_api import queued_tasks

    able = make_deployment(
        state=DeploymentState.READY, sleep_enabled=True, sleep_level=2, launch_argv=SLEEP_ARGV
    )
    with django_capture_on_commit_callbacks(execute=True):
        r = admin_client.post(f"/api/deployments/{able.pk}/sleep/", {}, format="json")
    assert r.status_code == 202, r.content
    assert queued_tasks(able.host.name) == [
        ("nodes.sleep_deployment", [able.pk], {"level": 2, "reason": "Sleep requested by an admin."})
    ]
    assert AuditEvent.objects.filter(after__action="sleep", after__level=2).count() == 1


def test_pool_sleep_refused_for_llamacpp_members_and_bad_values(
    admin_client: Any, make_deployment: Any
) -> None:
    make_deployment(engine="llamacpp")
    r = admin_client.post(
        "/api/route-pools/", {"name": "p", "alias": "llama-3.1-8b", "sleep_idle_seconds": 60}, format="json"
    )
    assert r.status_code == 400 and "llama.cpp" in r.json()["sleep_idle_seconds"][0]
    r = admin_client.post(
        "/api/route-pools/",
        {"name": "p", "alias": "other", "sleep_level": 0, "scale_to_zero": True, "wake_timeout_s": 0},
        format="json",
    )
    assert r.status_code == 400 and {"sleep_level", "scale_to_zero", "wake_timeout_s"} <= set(r.json())
    assert not RoutePool.objects.exists()


def test_pool_sleep_marks_its_engines_for_sleep_mode(admin_client: Any, make_deployment: Any) -> None:
    member = make_deployment()
    r = admin_client.post(
        "/api/route-pools/",
        {"name": "p", "alias": "llama-3.1-8b", "sleep_idle_seconds": 60, "scale_to_zero": True},
        format="json",
    )
    assert r.status_code == 201, r.content
    member.refresh_from_db()
    assert member.sleep_enabled
