"""In the browser: an admin builds a stage chain (guard + classify + generate) in the console, sees it drawn,
has an invalid regular expression refused at its stage with nothing saved, saves, sees each new version
with a diff, and the saved chain changes what the official openai client gets from /v1/ (the blocked term
refused); disabling the chain lifts that, and deleting it asks first."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
from playwright.sync_api import expect

from console.models import User
from core.redis_client import publish_config_change
from routing.models import RoutePool, StageChain, StageChainVersion
from tests.conftest import PASSWORD
from tests.e2e.harness import LiveConsole, login, screenshot
from tests.routing.conftest import make_tenant_key
from tests.routing.fleet import FleetMember, start_member

pytestmark = pytest.mark.e2e

ASK: dict[str, Any] = {"model": "llama", "max_tokens": 8, "seed": 3}


@pytest.fixture
def sim(transactional_db: None) -> Iterator[FleetMember]:
    member = start_member("llama")
    yield member
    member.sim.stop()


def eventually(check: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "the proxy did not take the chain as saved"
        time.sleep(0.2)


def test_build_a_chain_in_the_console(
    sim: FleetMember, live_console: LiveConsole, browser_page: Any, admin_user: User
) -> None:
    RoutePool.objects.create(name="llama-code", alias="llama")
    acme = make_tenant_key("acme")
    client = openai.OpenAI(base_url=live_console.url + "/v1", api_key=acme.raw_key, max_retries=0, timeout=30)

    def ask(text: str) -> str:
        try:
            reply = client.chat.completions.create(**ASK, messages=[{"role": "user", "content": text}])
        except openai.BadRequestError as exc:
            return f"refused: {exc.code}"
        return "answered" if reply.choices[0].message.content else "empty"

    publish_config_change("routing")  # the console's /v1/ may have loaded its snapshot before the pool
    eventually(lambda: ask("say something forbidden") == "answered")  # no chain yet

    page = browser_page
    login(page, admin_user.username, PASSWORD)
    page.get_by_role("link", name="Routing").click()
    page.get_by_test_id("stage-chains-link").click()
    expect(page.get_by_test_id("chains-table")).to_contain_text("No chains")
    page.get_by_role("link", name="New chain").click()

    form = page.get_by_test_id("chain-form")
    form.get_by_label("Name", exact=True).fill("guarded")
    form.get_by_label("Model alias").fill("llama")
    form.get_by_label("Tenant").select_option("acme")
    # A new chain starts with its generate step.
    generate = page.get_by_test_id("stage-0")
    expect(generate).to_have_attribute("data-kind", "generate")
    generate.get_by_label("Pool").select_option("llama")

    # A guard lands last; moved up, it checks the prompt before generation.
    page.get_by_test_id("add-stage-kind").select_option("guard")
    page.get_by_test_id("add-stage").click()
    page.get_by_test_id("stage-1").get_by_role("button", name="Move up").click()
    guard = page.get_by_test_id("stage-0")
    expect(guard).to_have_attribute("data-kind", "guard")
    guard.get_by_label("Stage name").fill("prompt-terms")
    guard.get_by_label("Terms (one a line)").fill("(forbidden")
    guard.get_by_label("Terms are regular expressions").check()

    # A classify stage goes before the generate step by itself.
    page.get_by_test_id("add-stage-kind").select_option("classify")
    page.get_by_test_id("add-stage").click()
    classify = page.get_by_test_id("stage-1")
    expect(classify).to_have_attribute("data-kind", "classify")
    classify.get_by_label("Keywords (comma-separated)").fill("def ,import")
    classify.get_by_label("Send to pool").select_option("llama-code")
    expect(page.get_by_test_id("stage-2")).to_have_attribute("data-kind", "generate")

    # The diagram follows the form: guard, classify, then generate with classify's branch and its fallback.
    diagram = page.get_by_test_id("chain-diagram")
    expect(diagram.get_by_test_id("diagram-stage")).to_have_count(2)
    expect(diagram.get_by_test_id("diagram-stage").first).to_contain_text("prompt-terms")
    expect(diagram.get_by_test_id("diagram-stage").first).to_contain_text("block 1 pattern")
    branches = diagram.get_by_test_id("diagram-branch")
    expect(branches).to_have_count(2)
    expect(branches.first).to_contain_text("keywords def, import")
    expect(branches.first).to_contain_text("llama-code")
    expect(branches.last).to_contain_text("llama")

    # Any stage can be edited as JSON too (kinds the form does not know only so); the diagram follows it.
    generate = page.get_by_test_id("stage-2")
    generate.get_by_role("button", name="Edit as JSON").click()
    config = generate.get_by_label("Config (JSON)")
    expect(config).to_have_value(re.compile(r'"pool": "llama"'))
    config.fill('{"pool": "llama-code"}')
    expect(branches.last).to_contain_text("llama-code")
    config.fill('{"pool": ')
    expect(page.get_by_test_id("stage-error-2")).to_contain_text("Config JSON")
    expect(generate.get_by_role("button", name="Back to form")).to_be_disabled()
    config.fill('{"pool": "llama"}')
    generate.get_by_role("button", name="Back to form").click()
    expect(generate.get_by_label("Pool")).to_have_value("llama")
    expect(branches.last).not_to_contain_text("llama-code")

    # The invalid regular expression: refused, the reason on the guard's card, nothing saved.
    page.get_by_test_id("chain-save").click()
    terms = guard.get_by_label("Terms (one a line)")
    expect(terms).to_have_attribute("aria-invalid", "true")
    error_id = terms.get_attribute("aria-describedby")
    expect(page.locator(f"[id='{error_id}']")).to_contain_text("terms[0] is not a valid regular expression")
    expect(page.locator(".stage-card-invalid")).to_have_count(1)  # the guard's card, no other
    guard.scroll_into_view_if_needed()
    screenshot(page, "stage-chain-invalid-regex", full_page=False)
    assert not StageChain.objects.exists() and not StageChainVersion.objects.exists()

    terms.fill("forbid+en")
    page.get_by_test_id("chain-save").click()
    expect(page).to_have_url(re.compile(r"/routing/chains/\d+$"))
    versions = page.get_by_test_id("versions-table")
    expect(versions.locator("tbody tr")).to_have_count(1)
    expect(versions).to_contain_text(admin_user.username)
    chain = StageChain.objects.get(name="guarded")
    assert [s["kind"] for s in chain.stages] == ["guard", "classify", "generate"]
    assert chain.tenant is not None and chain.tenant.name == "acme"
    rules = chain.stages[1]["config"]["rules"]
    assert rules == [{"match": {"keywords": ["def", "import"]}, "pool": "llama-code"}]

    # The saved chain applies to the tenant's requests through /v1/.
    eventually(lambda: ask("say something FORBIDDDEN") == "refused: content_filter")
    assert ask("say something nice") == "answered"

    # A second term: a new version, with the change shown in the diff.
    page.get_by_test_id("stage-0").get_by_label("Terms (one a line)").fill("forbid+en\nsecret")
    page.get_by_test_id("chain-save").click()
    expect(page.get_by_test_id("chain-saved")).to_have_text("Saved as version 2.")
    expect(versions.locator("tbody tr")).to_have_count(2)
    diff = page.get_by_test_id("version-diff")
    expect(diff.locator(".diff-add")).to_contain_text('"secret"')
    expect(diff.locator(".diff-del")).to_have_count(0)  # only a line added
    page.get_by_test_id("chain-diagram").scroll_into_view_if_needed()
    screenshot(page, "stage-chain-editor")
    eventually(lambda: ask("tell me a secret") == "refused: content_filter")

    # Disabled: kept (a version of its own) but applies to nothing.
    page.get_by_test_id("chain-toggle").click()
    expect(page.get_by_test_id("chain-toggle")).to_have_text("Enable")
    expect(versions.locator("tbody tr")).to_have_count(3)
    eventually(lambda: ask("say something forbidden") == "answered")

    page.get_by_role("link", name="All chains").click()
    row = page.get_by_test_id("chains-table").locator("tbody tr", has_text="guarded")
    expect(row).to_contain_text("disabled")
    expect(row).to_contain_text("v3")
    expect(page.get_by_test_id("chain-compact-guarded")).to_contain_text("generate (llama)")
    screenshot(page, "stage-chain-list")

    # Deleting asks first; cancelled, the chain stays.
    row.click()
    page.get_by_role("button", name="Delete").click()
    page.get_by_role("dialog").get_by_role("button", name="Cancel").click()
    assert StageChain.objects.filter(name="guarded").exists()
    page.get_by_role("button", name="Delete").click()
    page.get_by_role("dialog").get_by_role("button", name="Delete").click()
    expect(page).to_have_url(f"{live_console.url}/routing/chains")
    expect(page.get_by_test_id("chains-table")).to_contain_text("No chains")
    assert not StageChain.objects.exists()
