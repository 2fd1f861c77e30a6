"""The suite-wide key-leak check (tests/keyleak.py) records the keys tests make and finds them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from console.models import Tenant
from console.services import issue_api_key
from tests.keyleak import KeyLeakCheck


@pytest.mark.django_db
def test_every_key_a_test_creates_is_recorded_against_it(request: pytest.FixtureRequest) -> None:
    plugin = request.config.pluginmanager.get_plugin("keyleak")
    assert isinstance(plugin, KeyLeakCheck)
    issued = issue_api_key(tenant=Tenant.objects.create(name="leak-check"), name="k")
    assert plugin.keys[issued.raw_key] == request.node.nodeid


def test_a_key_on_a_child_command_line_is_found() -> None:
    check = KeyLeakCheck(patch=False)
    check.keys["ick_" + "Z" * 43] = "tests/x.py::test_y"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "ick_" + "Z" * 43])
    try:
        time.sleep(0.2)
        check._check_process_lists()
    finally:
        child.kill()
        child.wait()
    assert check.cmdline_leaks == [f"pid {child.pid}'s command line holds the key tests/x.py::test_y created"]


@pytest.mark.parametrize("clock_behind", [0.0, 0.001], ids=["same-clock", "mtime-before-start"])
def test_a_key_in_a_log_file_written_during_the_session_is_found(tmp_path: Path, clock_behind: float) -> None:
    check = KeyLeakCheck(patch=False)
    check.keys["ick_" + "Q" * 43] = "tests/x.py::test_z"
    log = Path(tempfile_dir()) / f"proxy-leakcheck-{time.time_ns()}.log"
    log.write_text("INFO request from key ick_" + "Q" * 43 + "\n")
    if clock_behind:
        # Written just after the check began, stamped just before it (the wall clock slewed back).
        os.utime(log, (check.started - clock_behind, check.started - clock_behind))
    try:

        class Session:
            config = type(
                "C", (), {"pluginmanager": type("P", (), {"get_plugin": staticmethod(lambda n: None)})()}
            )
            exitstatus = 0

        session = Session()
        check.pytest_sessionfinish(session, 0)  # type: ignore[arg-type]
        assert session.exitstatus == pytest.ExitCode.TESTS_FAILED
    finally:
        log.unlink()


def tempfile_dir() -> str:
    import tempfile

    return tempfile.gettempdir()
