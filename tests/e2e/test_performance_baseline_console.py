"""A bench run saved as a deployment's baseline in the console: the real `inferchain bench` measures a
simulator engine, an admin uploads its JSON on the deployment page, the page draws the curve and lists the
levels, and calls out a live TTFT far above the baseline at the same load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from console.models import User
from core.redis_client import get_redis
from nodes.lifecycle import live_deployment_key
from tests.conftest import PASSWORD
from tests.e2e.harness import login, screenshot
from tests.e2e.test_deployment_page import make_deployment
from vllm_sim.testing import running_sim

pytestmark = pytest.mark.e2e

KEY = "sk-baseline-e2e-0123456789"
ROOT = Path(__file__).resolve().parents[2]


def test_a_saved_baseline_shows_on_the_deployment_page(
    browser_page: Any,
    admin_user: User,
    settings: Any,
    tmp_path: Path,
    redis_clean: None,
) -> None:
    settings.ENGINE_LOG_DIR = tmp_path / "engines"
    deployment = make_deployment()
    run = tmp_path / "run.json"
    with running_sim("llama-3.1-8b", "--sim-time-scale", "0.2", api_key=KEY) as sim:
        # The real command line, in its own process (Playwright's loop runs in this one).
        done = subprocess.run(
            [sys.executable, "-m", "bench", "--no-progress", "--no-plot", "--target", sim.base_url,
             "--clients", "1,4", "--requests", "6", "--output-tokens", "8", "--prompt-tokens", "30",
             "--no-stop-at-knee", "--out", str(run)],
            cwd=ROOT, env={**os.environ, "INFERCHAIN_API_KEY": KEY}, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(run.read_text())
    ttft_at_4 = report["levels"][1]["ttft_s"]["p95"]

    page = browser_page
    login(page, admin_user.username, PASSWORD)
    page.goto(f"/nodes/deployments/{deployment.pk}")
    panel = page.get_by_test_id("baseline-panel")
    expect(panel.get_by_test_id("baseline-empty")).to_be_visible()

    # A file that is not a bench run is refused with the reason.
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"levels": []}))
    panel.get_by_test_id("baseline-file").set_input_files(str(bad))
    panel.get_by_test_id("baseline-save").click()
    expect(panel.get_by_test_id("baseline-error")).to_contain_text("no load levels")

    # The engine is carrying 4 requests with a TTFT p95 three times what the baseline saw at 4 clients.
    live = {"num_requests_running": 4.0, "num_requests_waiting": 0.0, "ttft_p95_s": ttft_at_4 * 3}
    get_redis().set(live_deployment_key(deployment.pk), json.dumps(live))

    panel.get_by_label("Baseline name").fill("sim, two levels")
    panel.get_by_test_id("baseline-file").set_input_files(str(run))
    panel.get_by_test_id("baseline-save").click()
    expect(panel.get_by_test_id("baseline-name")).to_contain_text("sim, two levels")
    expect(panel.get_by_test_id("baseline-name")).to_contain_text("llama-3.1-8b")
    rows = panel.get_by_test_id("baseline-levels").locator("tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.nth(0).locator("td").first).to_have_text("1")
    expect(rows.nth(1).locator("td").first).to_have_text("4")
    expect(panel.get_by_test_id("baseline-curve").locator("canvas")).to_have_count(1)
    check = panel.get_by_test_id("baseline-check")
    expect(check).to_have_attribute("data-status", "outside")
    expect(check).to_contain_text("3.0x the baseline at 4 requests in flight")
    screenshot(page, "deployment-baseline")
