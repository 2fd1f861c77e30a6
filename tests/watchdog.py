"""Every test runs under a watchdog that says why it hung: the stack of every thread, in the report.

pytest-timeout fails a test that runs past its timeout (pyproject's `timeout`, or a test's
`@pytest.mark.timeout`), but its stack dump of the other threads goes to the worker's terminal, which
pytest-xdist does not show: a hung test said only "Timeout". Here faulthandler's watchdog thread (C
code, so it fires even when every Python thread is stuck in a lock) writes every thread's stack to a
file `LEAD_SECONDS` before the timeout, and the failed test's report carries that file as a section,
which xdist sends to the controller like captured output.
"""

from __future__ import annotations

import faulthandler
import os
from collections.abc import Generator
from pathlib import Path
from typing import IO, Any

import pytest

# The stacks are taken this long before pytest-timeout fails the test: the test is stuck by then, and
# the dump is in the file before the failure is reported.
LEAD_SECONDS = 5.0
SECTION = "stacks of every thread, {at:.0f} s into the test"


def item_timeout(item: pytest.Item) -> float:
    """The timeout pytest-timeout applies to `item`: its marker, else --timeout, else the ini value."""
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        value = marker.kwargs.get("timeout", marker.args[0] if marker.args else None)
        if value is not None:
            return float(value)
    option = item.config.getoption("timeout", None)
    if option is not None:
        return float(option)
    ini = item.config.getini("timeout")
    return float(ini) if ini not in (None, "") else 0.0


class Watchdog:
    """A pytest plugin: arms faulthandler for each test, attaches its dump to a failed test's report."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        self.path = directory / f"stacks-{worker}.txt"
        self.handle: IO[str] | None = None
        self.dump_at = 0.0

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, None, None]:
        timeout = item_timeout(item)
        if timeout <= 0:
            yield
            return
        self.dump_at = max(1.0, timeout - LEAD_SECONDS)
        with self.path.open("w+") as handle:
            self.handle = handle
            faulthandler.dump_traceback_later(self.dump_at, repeat=False, file=handle)
            try:
                yield
            finally:
                faulthandler.cancel_dump_traceback_later()
                self.handle = None

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[Any]
    ) -> Generator[Any, Any, None]:
        outcome = yield
        report = outcome.get_result()
        if not report.failed or self.handle is None:
            return
        stacks = self.stacks()
        if stacks:
            report.sections.append((SECTION.format(at=self.dump_at), stacks))

    def stacks(self) -> str:
        """What faulthandler wrote for the current test (it writes to the file descriptor directly)."""
        assert self.handle is not None
        self.handle.flush()
        self.handle.seek(0)
        return self.handle.read()
