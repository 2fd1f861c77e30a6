"""Every console page fits a 1280x800 and a 1440x900 window: no table or box scrolls sideways, the page
itself does not, and no text overlaps other text or a badge.

The pages are the routes of frontend/src/routes.tsx, read from the file, so a page added later is checked
without touching this test; a route with a parameter (`:id`, `:alias`) needs a seeded object named in
`route_params`, and the test fails until it has one. The data is the demo's shape (its hosts, engines,
versions, pools, tenants, an evaluation run by the real runner) with the longest names and values the
console shows, so a column that only overflows with real data overflows here.

`make screenshots` runs this test with LAYOUT_SCREENSHOTS set: every page is then also shot, at both sizes,
into that folder (docs/screenshots/<page>-<width>x<height>.png): the window, or the whole page with
LAYOUT_SCREENSHOTS_FULL_PAGE=1.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
from playwright.sync_api import expect

from alerts import services as alerts
from console.models import Quota, Tenant, User
from console.services import issue_api_key
from core.audit import record_audit
from core.choices import AuditAction
from core.redis_client import get_redis
from models_registry.demo import seed_config_only
from models_registry.evaluation.models import EvalRun
from models_registry.models import Model, ModelAlias, ModelStore, ModelVersion, QuantizationConfig
from models_registry.services import register_version
from nodes.agent.gpus import GpuSource, simulated_gpu_config
from nodes.agent.services import report_gpus
from nodes.choices import DeploymentState, Engine, HostState
from nodes.demo import DEMO_ENGINES, DEMO_HOSTS, LLAMA_31_8B_CONFIG, seed_demo_evaluation, write_config_dir
from nodes.lifecycle import live_deployment_key, live_gpu_key
from nodes.models import Deployment, Host
from routing.demo import DEMO_ALIAS, DEMO_TENANT_QUOTA, seed_demo_routing
from routing.models import RequestLog, Rollout, RoutePool, ShadowConfig, StageChain
from routing.scaling.models import ScalingPolicy
from tests.conftest import PASSWORD
from tests.e2e.harness import REPO_ROOT, login
from tests.e2e.telemetry import seed_hour
from tests.routing.rollouts import shadow_pair

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("redis_clean"), pytest.mark.timeout(600)]

ROUTES_FILE = REPO_ROOT / "frontend" / "src" / "routes.tsx"
VIEWPORTS = ((1280, 800), (1440, 900))
SETTLE_MS = 400  # after the data is in: charts size themselves, fonts apply
LONG_ALIAS = "llama-3.1-8b-instruct-long-context"


def console_paths() -> list[str]:
    """The console's route paths as routes.tsx lists them ("" is the dashboard)."""
    paths = re.findall(r"\{\s*path:\s*\"([^\"]*)\"", ROUTES_FILE.read_text())
    assert "" in paths and "nodes" in paths, f"no routes found in {ROUTES_FILE}"
    return paths


def shot_name(path: str) -> str:
    """A file name for a route: "" -> dashboard, "nodes/deployments/:id" -> nodes-deployments-id."""
    return re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-") or "dashboard"


# -- the data -------------------------------------------------------------------------------------------


def _versions(root: Path) -> dict[str, ModelVersion]:
    """The demo's Llama-3.1-8B fp16 and AWQ versions (registered from config-only directories, as the demo
    does), its 70B family, and the packaged SmolLM2 GGUF as a registry row."""
    model = Model.objects.create(
        name="Llama-3.1-8B-Instruct (demo)",
        architecture="LlamaForCausalLM",
        task_tags=["chat", "long-context", "function-calling"],
        description="Simulated.",
    )
    awq = QuantizationConfig.objects.create(name="awq-int4-g128", method="awq", bits=4, group_size=128)
    fp16 = register_version(
        model=model,
        revision="demo-fp16",
        source_path=str(write_config_dir(root / "llama-3.1-8b-fp16", LLAMA_31_8B_CONFIG)),
    )
    awq_version = register_version(
        model=model,
        revision="demo-awq-int4-g128-2024-07-23",
        source_path=str(write_config_dir(root / "llama-3.1-8b-awq", LLAMA_31_8B_CONFIG)),
        quantization=awq,
        parent=fp16,
    )
    seed_config_only()
    smol = ModelVersion.objects.create(
        model=Model.objects.create(name="SmolLM2-135M-Instruct", architecture="llama", task_tags=["chat"]),
        revision="q4_1",
        source_kind="gguf",
        source_path=str(root / "smollm2-135m-instruct-q4_1.gguf"),
        parameter_count=134_515_008,
        max_context=8192,
        state="verified",
        file_count=1,
        total_bytes=99_452_128,
        quantization=QuantizationConfig.objects.create(name="gguf-q4_1", method="gguf-q4_1", bits=4),
    )
    ModelAlias.objects.create(name=DEMO_ALIAS, active_version=fp16, task_tags=["chat", "long-context"])
    ModelAlias.objects.create(name=LONG_ALIAS, active_version=awq_version, task_tags=["chat", "summarize"])
    ModelAlias.objects.create(name="smollm2-135m", active_version=smol, task_tags=["chat"])
    ModelStore.objects.create(
        name="team-bucket-eu-central",
        kind="s3",
        location="s3://inferchain-models-production-eu-central-1/checkpoints/meta-llama",
        endpoint_url="https://s3.eu-central-1.amazonaws.com",
        region="eu-central-1",
        is_active=True,
        description="Where the fleet's checkpoints are kept between hosts.",
    )
    return {"fp16": fp16, "awq": awq_version, "smol": smol}


def _fleet(versions: dict[str, ModelVersion]) -> dict[str, Deployment]:
    """The demo's hosts and engines, ready, with live figures and an hour of history; one host down."""
    now = timezone.now()
    hosts: dict[str, Host] = {}
    for spec in DEMO_HOSTS:
        host = Host.objects.create(
            name=spec.name,
            address="127.0.0.1",
            role=spec.role,
            cost_per_hour=spec.cost_per_hour,
            labels={"demo": "true", "gpu_profile": spec.gpu_profile},
            state=HostState.ONLINE,
            last_heartbeat=now,
        )
        report_gpus(
            host, GpuSource(host.name, simulated_gpu_config(spec.gpu_profile, spec.gpu_count)).inventory()
        )
        hosts[spec.name] = host
    down = Host.objects.create(
        name="gpu-node-eu-central-07",
        address="10.20.30.47",
        role="high-throughput",
        state=HostState.UNREACHABLE,
        last_heartbeat=now - dt.timedelta(minutes=40),
    )
    report_gpus(down, GpuSource(down.name, simulated_gpu_config("a10-llama3-8b-int4", 1)).inventory())
    deployments: dict[str, Deployment] = {}
    for n, engine in enumerate(DEMO_ENGINES):
        deployments[engine.name] = Deployment.objects.create(
            name=engine.name,
            model_version=versions[engine.version if engine.version == "fp16" else "awq"],
            engine=Engine.SIM,
            host=hosts[engine.host],
            gpu_indices=list(engine.gpu_indices),
            gpu_memory_utilization=engine.gpu_memory_utilization,
            max_model_len=engine.max_model_len,
            max_num_seqs=engine.max_num_seqs,
            port=28101 + n,
            served_model_name=DEMO_ALIAS,
            role=engine.role,
            state=DeploymentState.READY,
            extra_args=["--sim-profile", engine.sim_profile],
        )
    deployments["smollm2-cpu"] = Deployment.objects.create(
        name="smollm2-cpu",
        model_version=versions["smol"],
        engine=Engine.LLAMACPP,
        host=hosts["demo-b"],
        gpu_indices=[],
        max_model_len=2048,
        max_num_seqs=1,
        port=28104,
        served_model_name="smollm2-135m",
        role="cpu-postprocess",
        state=DeploymentState.READY,
    )
    Deployment.objects.create(
        name="llama8b-fast-2",
        model_version=versions["awq"],
        engine=Engine.VLLM,
        host=down,
        gpu_indices=[0],
        port=28105,
        served_model_name=DEMO_ALIAS,
        role="high-throughput",
        state=DeploymentState.FAILED,
        state_reason="The host stopped answering: no heartbeat for 40 minutes.",
    )
    r = get_redis()
    for n, deployment in enumerate(deployments.values()):
        live = {
            "kv_cache_usage_perc": 0.004 + 0.31 * n,
            "tokens_per_s": 1234.5 + 517.0 * n,
            "num_requests_running": 12 + n,
            "num_requests_waiting": n,
        }
        r.set(live_deployment_key(deployment.pk), json.dumps(live), ex=600)
    for spec in DEMO_HOSTS:
        for index in range(spec.gpu_count):
            gpu = {"utilization_pct": 87.0, "memory_used_bytes": 71 * 1024**3, "temperature_c": 71.0}
            r.set(live_gpu_key(spec.name, index), json.dumps(gpu | {"power_watts": 612.0}), ex=600)
    seed_hour("demo-a", 0, deployments["llama8b-long"].pk)
    seed_hour("demo-b", 0, deployments["llama8b-fast-0"].pk)
    return deployments


def _routing(versions: dict[str, ModelVersion], deployments: dict[str, Deployment], tenant: Tenant) -> str:
    """The demo's pools and policy, a scaling policy, a guarded stage chain, a canary and shadow pairs;
    returns the alias whose shadow pairs are shown."""
    seed_demo_routing()
    fast = RoutePool.objects.get(name="llama-fast")
    ScalingPolicy.objects.create(
        pool=fast,
        template=deployments["llama8b-fast-0"],
        min_engines=2,
        max_engines=6,
        last_reason="waiting 3.4 per engine over the target 2.0 for 45 s: scale up from 2 to 3 engines",
    )
    StageChain.objects.create(
        name="guarded-summaries-for-acme-support",
        alias=DEMO_ALIAS,
        tenant=tenant,
        stages=[
            {
                "kind": "guard",
                "name": "no secrets",
                "config": {"terms": ["password", "api[_-]?key"], "regex": True},
            },
            {"kind": "generate"},
        ],
    )
    alias = ModelAlias.objects.get(name=DEMO_ALIAS)
    Rollout.objects.create(
        alias=alias,
        baseline_version=versions["fp16"],
        candidate_version=versions["awq"],
        steps=[1, 5, 25, 50, 100],
        step_index=2,
        share=25,
        gates={"max_error_rate_delta": 0.01, "max_p95_latency_ratio": 1.2, "max_flip_rate": 0.05},
        reason="step 25 %: 412 candidate requests, error rate +0.2 pp, p95 latency x1.04, flips 1.9 %",
    )
    ShadowConfig.objects.create(alias=alias, candidate_version=versions["awq"], percent=10)
    answer = "The capital of France is Paris, a city on the Seine known for the Louvre and the Eiffel Tower."
    drifted = (
        "The capital of France is Paris, a city on the Seine famous for its museums and the Eiffel Tower."
    )
    shadow_pair(
        alias, versions["fp16"], versions["awq"], answer, drifted, prompt="What is the capital of France?"
    )
    shadow_pair(
        alias, versions["fp16"], versions["awq"], answer, answer, prompt="What is the capital of France?"
    )
    return alias.name


def _tenants(user: User) -> tuple[Tenant, list[str]]:
    """The demo tenant with its quota and keys (one scoped, one revoked) and a second, long-named tenant;
    returns the demo tenant and its key prefixes."""
    demo = Tenant.objects.create(name="demo", description="Demo tenant created by make run")
    Quota.objects.create(tenant=demo, **DEMO_TENANT_QUOTA)
    keys = [
        issue_api_key(tenant=demo, name="demo key (make run)").api_key,
        issue_api_key(tenant=demo, name="nightly batch summaries", scopes=[DEMO_ALIAS, LONG_ALIAS]).api_key,
    ]
    other = Tenant.objects.create(
        name="acme-customer-support-europe", description="Support assistants of the European help desk."
    )
    Quota.objects.create(tenant=other, requests_per_minute=1200, tokens_per_minute=900_000)
    issue_api_key(tenant=other, name="helpdesk assistant (production)")
    record_audit(
        actor=user,
        action=AuditAction.UPDATE,
        obj=Quota.objects.get(tenant=other),
        object_type="console.quota",
        before={"requests_per_minute": 600, "tokens_per_minute": 200_000, "daily_token_budget": 5_000_000},
        after={"requests_per_minute": 1200, "tokens_per_minute": 900_000, "daily_token_budget": 50_000_000},
    )
    return demo, [k.prefix for k in keys]


def _request_log(tenant: Tenant, prefixes: list[str], deployments: dict[str, Deployment]) -> None:
    """An hour of the demo's traffic in the request log: answers, refusals, an upstream error, stages."""
    now = timezone.now()
    long, fast = deployments["llama8b-long"], deployments["llama8b-fast-0"]
    rows = []
    for n in range(60):
        deployment = long if n % 3 == 0 else fast
        status = (200, 200, 200, 429, 200, 502)[n % 6]
        rows.append(
            RequestLog(
                created_at=now - dt.timedelta(seconds=37 * n + 1),
                request_id=f"{n:04x}5f3c2a9e0b1d4c6e8f7a{n:08x}",
                tenant_id=tenant.pk,
                tenant_name=tenant.name,
                key_prefix=prefixes[n % len(prefixes)],
                endpoint_kind="chat",
                alias=LONG_ALIAS if n % 4 == 0 else DEMO_ALIAS,
                deployment_id=deployment.pk if status != 429 else None,
                model_version_id=deployment.model_version_id if status != 429 else None,
                upstream=f"http://127.0.0.1:{deployment.port}" if status != 429 else "",
                status=status,
                error_type={429: "rate_limit_exceeded", 502: "upstream_error"}.get(status, ""),
                stream=n % 2 == 0,
                prompt_tokens=61_440 if n % 3 == 0 else 1_812,
                completion_tokens=None if status != 200 else 512,
                ttft_ms=None if status != 200 else 1_234.5,
                latency_ms=18_734.2 if status == 200 else 3.1,
                route_pool="llama-long" if deployment is long else "llama-fast",
                route_reason=(
                    "policy llama by prompt length rule 2: max_prompt_tokens 6000; spill to llama-long "
                    "(home inflight 14 >= 1, kv 0.31 < 0.5); least_outstanding inflight=3"
                ),
                stages=[
                    {"name": "no secrets", "kind": "guard", "outcome": "pass", "ms": 0.4},
                    {"name": "generate", "kind": "generate", "outcome": "pass", "ms": 18_733.1},
                ],
            )
        )
    RequestLog.objects.bulk_create(rows)


def _alerts(user: User) -> None:
    """The alert rules evaluated twice, a rule's for-duration apart: the down host's alert fires."""
    t0 = timezone.now().timestamp()
    alerts.evaluate(t0)
    alerts.evaluate(t0 + 300)  # past the engine-down and host-down rules' for-durations
    record_audit(
        actor=user,
        action=AuditAction.UPDATE,
        obj=RoutePool.objects.get(name="llama-fast"),
        before={"scorer": "least_outstanding", "first_byte_timeout_s": 30.0, "max_inflight_per_engine": None},
        after={"scorer": "prefix_affinity", "first_byte_timeout_s": 45.0, "max_inflight_per_engine": 24},
    )


@pytest.fixture
def seeded(
    admin_user: User, tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    """The console's data, and the object each parametrized route shows."""
    settings.MODEL_ROOTS = [tmp_path / "models"]
    # No agent beats for the demo hosts: their one heartbeat stays fresh for the test's length (here and
    # in the console process, which reads the environment), so only the host marked down shows down.
    settings.NODE_UNREACHABLE_SECONDS = 3600.0
    monkeypatch.setenv("NODE_UNREACHABLE_SECONDS", "3600")
    versions = _versions(tmp_path / "models" / "demo")
    deployments = _fleet(versions)
    tenant, prefixes = _tenants(admin_user)
    shadow_alias = _routing(versions, deployments, tenant)
    _request_log(tenant, prefixes, deployments)
    _alerts(admin_user)
    seed_demo_evaluation()  # the demo's evaluation run: two simulators and the real runner
    run = EvalRun.objects.get()
    return {
        "nodes/deployments/:id": deployments["llama8b-fast-0"].pk,
        "models/versions/:id": versions["awq"].pk,
        "routing/chains/:id": StageChain.objects.get().pk,
        "rollouts/shadow/:alias": shadow_alias,
        "tenants/:id": tenant.pk,
        "evaluations/suites/:id": run.suite_version.suite_id,
        "evaluations/runs/:id": run.pk,
    }


# -- the check ------------------------------------------------------------------------------------------

# Runs in the page: what does not fit, as a list of sentences. Three checks:
# 1. the document scrolls sideways;
# 2. a box that scrolls sideways (overflow-x auto or scroll) has more to show than fits: a table in its
#    wrapper, a card; the columns out of view are named;
# 3. two pieces of text, or text and a badge or button, overlap on screen. Text is measured per line box
#    (a Range over each text node), clipped by any ancestor that hides its overflow, so an ellipsis that
#    cuts a long value is fine; a badge or button counts as one box, its padding included.
LAYOUT_PROBLEMS_JS = r"""
() => {
  const problems = [];
  const main = document.querySelector(".main") || document.body;
  const name = (el) => {
    const owner = el.closest("[data-testid]");
    const card = el.closest(".card");
    const title = card && card.querySelector(".card-header h2");
    const parts = [];
    if (owner) parts.push(`[data-testid=${owner.getAttribute("data-testid")}]`);
    if (title) parts.push(`card "${title.textContent.trim()}"`);
    const classes = typeof el.className === "string" ? el.className.trim().split(/\s+/).filter(Boolean) : [];
    if (!parts.length) parts.push([el.tagName.toLowerCase(), ...classes].join("."));
    return parts.join(" in ");
  };
  const root = document.documentElement;
  if (root.scrollWidth > root.clientWidth + 1) {
    problems.push(`the page scrolls sideways: ${root.scrollWidth} px in a ${root.clientWidth} px window`);
  }
  for (const el of main.querySelectorAll("*")) {
    const style = getComputedStyle(el);
    if (style.overflowX !== "auto" && style.overflowX !== "scroll") continue;
    if (!el.clientWidth || el.scrollWidth <= el.clientWidth + 1) continue;
    const right = el.getBoundingClientRect().right;
    const hidden = [...el.querySelectorAll("thead th")]
      .filter((th) => th.getBoundingClientRect().right > right + 1)
      .map((th) => th.textContent.trim() || "(unnamed)");
    problems.push(
      `${name(el)} scrolls sideways (${el.scrollWidth} px of content in ${el.clientWidth} px)` +
        (hidden.length ? `; columns out of view: ${hidden.join(", ")}` : "")
    );
  }
  const ATOMS = ".badge, .btn, button, .tag, .role";
  // The rect as seen: cut by `from` and every ancestor above it that hides its overflow.
  const clip = (rect, from) => {
    let { left, top, right, bottom } = rect;
    for (let a = from; a && a !== document.body; a = a.parentElement) {
      const s = getComputedStyle(a);
      if (s.overflowX === "visible" && s.overflowY === "visible") continue;
      const r = a.getBoundingClientRect();
      if (s.overflowX !== "visible") { left = Math.max(left, r.left); right = Math.min(right, r.right); }
      if (s.overflowY !== "visible") { top = Math.max(top, r.top); bottom = Math.min(bottom, r.bottom); }
    }
    return right - left > 1 && bottom - top > 1 ? { left, top, right, bottom } : null;
  };
  const boxes = [];
  const atomsSeen = new Set();
  const walker = document.createTreeWalker(main, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const text = node.textContent.trim();
    const parent = node.parentElement;
    if (!text || !parent) continue;
    if (parent.closest("svg, canvas, script, style, select, textarea, .chart-tooltip, .u-legend")) continue;
    if (!parent.checkVisibility({ opacityProperty: true, visibilityProperty: true })) continue;
    const atom = parent.closest(ATOMS);
    if (atom && main.contains(atom)) {
      if (atomsSeen.has(atom)) continue;
      atomsSeen.add(atom);
      const box = clip(atom.getBoundingClientRect(), atom.parentElement);
      if (box) boxes.push({ ...box, owner: atom, text: atom.textContent.trim() });
      continue;
    }
    const range = document.createRange();
    range.selectNodeContents(node);
    for (const rect of range.getClientRects()) {
      const box = clip(rect, parent);
      if (box) boxes.push({ ...box, owner: parent, text });
    }
  }
  boxes.sort((a, b) => a.top - b.top);
  const overlaps = [];
  for (let i = 0; i < boxes.length; i++) {
    const a = boxes[i];
    for (let j = i + 1; j < boxes.length && boxes[j].top < a.bottom; j++) {
      const b = boxes[j];
      if (a.owner === b.owner || a.owner.contains(b.owner) || b.owner.contains(a.owner)) continue;
      const w = Math.min(a.right, b.right) - Math.max(a.left, b.left);
      const h = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
      if (w > 2 && h > 2) {
        const [first, second] = [a.text.slice(0, 40), b.text.slice(0, 40)].sort();
        overlaps.push(`"${first}" and "${second}" overlap in ${name(a.owner)}`);
      }
    }
  }
  for (const o of [...new Set(overlaps)].slice(0, 8)) problems.push(o);
  return problems;
}
"""

WAIT_FOR_DATA_JS = """
() => {
  const main = document.querySelector(".content");
  return !!main && !!main.querySelector("h1") && !main.innerText.includes("Loading\u2026");
}
"""


def check_fit(page: Any) -> None:
    """The fit calculator shows its arithmetic (a table of steps) once asked, here for the demo's 8B."""
    page.get_by_label("Version").select_option(label="Llama-3.1-8B-Instruct (demo)@demo-fp16")
    page.get_by_role("button", name="Check fit").click()
    page.get_by_test_id("fit-steps").wait_for()


# What a page shows only after a click: done before it is checked.
PAGE_ACTIONS = {"models/fit": check_fit}


def check_page(page: Any, path: str, url: str) -> list[str]:
    """Open `url`, wait for its data, and return what does not fit."""
    page.goto(url)
    try:
        page.wait_for_function(WAIT_FOR_DATA_JS, timeout=20_000)
    except PlaywrightTimeoutError:  # a page that never loads is reported with the others
        return ["still loading after 20 s"]
    if path in PAGE_ACTIONS:
        PAGE_ACTIONS[path](page)
    page.evaluate("() => document.fonts.ready")
    page.wait_for_timeout(SETTLE_MS)
    problems: list[str] = page.evaluate(LAYOUT_PROBLEMS_JS)
    return problems


def test_every_page_fits_1280_and_1440_wide_windows(
    seeded: dict[str, Any], browser_page: Any, admin_user: User
) -> None:
    # `seeded` first: the evaluation run it starts pushes live events, which needs no browser loop around.
    page = browser_page
    login(page, admin_user.username, PASSWORD)
    shots = os.environ.get("LAYOUT_SCREENSHOTS")
    shots_dir = Path(shots) if shots else None
    full_page = os.environ.get("LAYOUT_SCREENSHOTS_FULL_PAGE") == "1"
    if shots_dir:
        shots_dir.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []
    paths = console_paths()
    for width, height in VIEWPORTS:
        page.set_viewport_size({"width": width, "height": height})
        for path in paths:
            params = re.findall(r":(\w+)", path)
            if params and path not in seeded:
                failures.append(f"/{path}: no seeded object for {', '.join(params)}; add one to `seeded`")
                continue
            url = "/" + (re.sub(r":\w+", str(seeded[path]), path) if params else path)
            problems = check_page(page, path, url)
            if shots_dir:
                shot = shots_dir / f"{shot_name(path)}-{width}x{height}.png"
                page.screenshot(path=str(shot), full_page=full_page)
            failures += [f"{width}x{height} {url}: {p}" for p in problems]
    assert not failures, "pages that do not fit:\n" + "\n".join(failures)

    # At 1280 px the Nodes page keeps the columns an operator reads (KV cache, tokens/s) in view; what made
    # room is folded into each row's ▸, which shows it below the row.
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto("/nodes")
    table = page.get_by_test_id("deployments-table")
    for name in ("Name", "Model", "State", "KV cache", "Tokens/s"):
        expect(table.locator("thead th", has_text=name)).to_be_visible()
    expect(table.locator("thead th", has_text="Port")).to_have_count(0)
    row = table.locator("tbody tr", has_text="llama8b-fast-0")
    row.get_by_role("button", name=re.compile(r"^Show .*Port")).click()
    details = table.locator("tr.row-details")
    expect(details).to_contain_text("Port")
    expect(details).to_contain_text(str(Deployment.objects.get(name="llama8b-fast-0").port))
    expect(page).to_have_url(re.compile(r"/nodes$"))  # the toggle is not the row's link
