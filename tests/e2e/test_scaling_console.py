"""In the browser: an admin adds a scaling policy to a pool on the Routing page (a bad one is refused next
to its field), then the pool's fabricated load makes the scaler add an engine, and the page shows the
decision, the new target and the engine starting."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from playwright.sync_api import expect

from console.models import User
from models_registry.models import ModelAlias
from nodes.choices import DeploymentState, Engine
from nodes.models import Deployment, Host
from routing.models import RoutePool
from routing.scaling import autoscaler
from routing.scaling.models import ScalingPolicy
from tests.conftest import PASSWORD
from tests.e2e.harness import LiveConsole, login, screenshot
from tests.nodes.conftest import make_host, register_llama
from tests.nodes.scaling_helpers import ROLE, at, set_live

pytestmark = pytest.mark.e2e


def test_a_pool_scaling_in_the_console(
    live_console: LiveConsole, browser_page: Any, admin_user: User, tmp_path: Path, redis_clean: None
) -> None:
    root = tmp_path / "models"
    root.mkdir()
    settings.MODEL_ROOTS = [root]
    host = make_host("gpu-a", gpus=2)
    Host.objects.filter(pk=host.pk).update(role=ROLE)
    version = register_llama(root, host.name)
    ModelAlias.objects.create(name="llama-3.1-8b", active_version=version)
    template = Deployment.objects.create(
        name="llama-fast-1",
        model_version=version,
        engine=Engine.SIM,
        host=host,
        gpu_indices=[0],
        gpu_memory_utilization=0.45,
        port=18600,
        served_model_name="llama-3.1-8b",
        role=ROLE,
        state=DeploymentState.READY,
    )
    RoutePool.objects.create(name="llama-fast", alias="llama-3.1-8b", role=ROLE)

    page = browser_page
    login(page, admin_user.username, PASSWORD)
    page.get_by_role("link", name="Routing").click()
    card = page.get_by_test_id("scaling-llama-fast")
    expect(card).to_contain_text("fixed size")
    page.get_by_test_id("scaling-edit-llama-fast").click()
    dialog = page.get_by_test_id("scaling-dialog")
    expect(dialog.get_by_label("Template deployment")).to_have_value(str(template.pk))
    dialog.get_by_label("Minimum engines").fill("3")
    dialog.get_by_label("Maximum engines").fill("2")
    dialog.get_by_role("button", name="Save").click()
    expect(dialog).to_contain_text("Must be at least min_engines (3).")
    dialog.get_by_label("Minimum engines").fill("1")
    dialog.get_by_label("Maximum engines").fill("3")
    dialog.get_by_label("Scale-up cooldown (s)").fill("15")
    dialog.get_by_role("button", name="Save").click()
    expect(dialog).to_be_hidden()
    expect(card).to_contain_text("enabled")
    expect(card.get_by_test_id("scaling-engines")).to_have_text("1 serving")
    expect(card).to_contain_text("No scaling decision yet.")
    policy = ScalingPolicy.objects.get()
    assert (policy.template_id, policy.max_engines, policy.scale_up_cooldown_s) == (template.pk, 3, 15)

    # Twelve requests wait on the one engine (what its agent would publish), and the scaler runs.
    set_live(template, waiting=12, running=16, kv=0.7)
    decision = autoscaler.evaluate(policy.pk, now=at(0))
    assert decision is not None and decision.action == "scale_up"

    decisions = card.get_by_test_id("scaling-decisions")
    expect(decisions).to_contain_text("scale up", timeout=15_000)
    expect(decisions).to_contain_text("1 → 2")
    expect(decisions).to_contain_text("12.0 waiting per engine > 2")
    expect(decisions).to_contain_text("on gpu-a")
    expect(card.get_by_test_id("scaling-target")).to_have_text("2")
    expect(card.get_by_test_id("scaling-engines")).to_have_text("1 serving, 1 starting")
    screenshot(page, "routing-autoscaling")
