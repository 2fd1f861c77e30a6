"""A suite-wide check that no raw key leaks: every API key and engine key the tests create is recorded,
and each is looked for in

- every test's captured stdout, stderr and log records (the test fails, naming the key's creator),
- the command lines of the processes the test started, while they run (the same),
- at the end of the session, the log files written during it: those of processes the tests started
  (proxies, simulators, backends in the temp directory) and engine logs under pytest's basetemp.

Keys are recorded by wrapping `console.services.issue_api_key` (the only place a raw API key is made)
and `nodes.lifecycle.engine_api_key` (the only place an engine key is derived).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

MAX_LOG_BYTES = 64 * 1024 * 1024
# Log files count from a little before the session began. A file's mtime is the kernel's stamp, not
# guaranteed to be at or after a time.time() read just before the write: the kernel may stamp from its
# clock tick (coarse), and the wall clock is adjusted (here it drifted 0.05 ms back against the monotonic
# clock over 20 s). The unit test that writes a file right after making the check saw its file passed
# over once in a full run (1 of 1899); which of the two it was, that run could not say. A file from before
# the session cannot hold a key the session made, so the margin only reads a few more files.
MTIME_SLACK_SECONDS = 2.0


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # Field 4 (ppid) follows the parenthesised command name, which may itself hold spaces.
        ppid = int(stat[stat.rfind(b")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class KeyLeakCheck:
    """The pytest plugin: see the module docstring."""

    def __init__(self, *, patch: bool = True) -> None:
        self.keys: dict[str, str] = {}  # raw key -> the test that created it
        self.current = "(collection)"
        self.started = time.time()
        self.cmdline_leaks: list[str] = []
        self.originals: dict[str, tuple[Any, Callable[..., Any], Callable[..., Any]]] = {}
        if patch:
            self._patch()

    # ---- recording -------------------------------------------------------------------------------

    def _patch(self) -> None:
        import console.services
        import nodes.lifecycle

        def issue_api_key(*args: Any, **kwargs: Any) -> Any:
            issued = original_issue(*args, **kwargs)
            self.keys.setdefault(issued.raw_key, self.current)
            return issued

        def engine_api_key(*args: Any, **kwargs: Any) -> str:
            key: str = original_engine(*args, **kwargs)
            self.keys.setdefault(key, self.current)
            return key

        original_issue = console.services.issue_api_key
        original_engine = nodes.lifecycle.engine_api_key
        self.originals = {
            "issue_api_key": (console.services, original_issue, issue_api_key),
            "engine_api_key": (nodes.lifecycle, original_engine, engine_api_key),
        }
        self._rebind()

    def _rebind(self) -> None:
        """Point every module's binding of the originals (`from x import f`) at the recording wrappers."""
        for name, (_, original, wrapper) in self.originals.items():
            for module in list(sys.modules.values()):
                if getattr(module, name, None) is original:
                    setattr(module, name, wrapper)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self._rebind()

    # ---- per test --------------------------------------------------------------------------------

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
        self.current = item.nodeid
        try:
            return (yield)
        finally:
            self.current = "(between tests)"

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Iterator[None]:
        try:
            return (yield)
        finally:
            self._check_process_lists()

    def _check_process_lists(self) -> None:
        if not self.keys:
            return
        for pid in _descendants(os.getpid()):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            for key, creator in self.keys.items():
                if key in cmdline:
                    self.cmdline_leaks.append(f"pid {pid}'s command line holds the key {creator} created")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        leaks = [f"{r}" for r in self.cmdline_leaks] if call.when == "call" else []
        if call.when == "call":
            self.cmdline_leaks = []
        text = "\n".join(content for _, content in report.sections)
        for key, creator in self.keys.items():
            if key in text:
                leaks.append(f"captured output ({call.when}) holds the raw key {creator} created")
        if leaks and not report.failed:
            report.outcome = "failed"
            report.longrepr = "Raw key leaked (tests/keyleak.py):\n" + "\n".join(
                f"- {leak}" for leak in leaks
            )
        return report

    # ---- end of session --------------------------------------------------------------------------

    def _log_files(self, session: pytest.Session) -> list[Path]:
        files: list[Path] = []
        for entry in os.scandir(tempfile.gettempdir()):
            if entry.is_file(follow_symlinks=False) and ".log" in entry.name:
                files.append(Path(entry.path))
        factory = getattr(session.config, "_tmp_path_factory", None)
        basetemp = getattr(factory, "_basetemp", None)
        if basetemp is not None and Path(basetemp).exists():
            files += [p for p in Path(basetemp).rglob("*.log*") if p.is_file()]
        fresh = []
        for path in files:
            try:
                st = path.stat()
            except OSError:
                continue
            fresh_enough = st.st_mtime >= self.started - MTIME_SLACK_SECONDS
            if fresh_enough and st.st_size <= MAX_LOG_BYTES and os.access(path, os.R_OK):
                fresh.append(path)
        return fresh

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if not self.keys:
            return
        leaks = []
        for path in self._log_files(session):
            try:
                text = path.read_bytes().decode(errors="replace")
            except OSError:
                continue
            leaks += [
                f"{path} holds the raw key {creator} created"
                for key, creator in self.keys.items()
                if key in text
            ]
        if leaks:
            reporter = session.config.pluginmanager.get_plugin("terminalreporter")
            lines = ["Raw keys leaked into log files (tests/keyleak.py):", *(f"- {leak}" for leak in leaks)]
            if reporter is not None:
                reporter.write_line("\n".join(lines), red=True)
            else:
                print("\n".join(lines), file=sys.stderr)
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
