"""scripts/run_logged.py: output shown and kept, a death by signal said, SIGTERM passed on."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "run_logged.py"


def run_logged(log: Path, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(log), "--", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_output_is_shown_and_kept_and_the_status_passed_through(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "run.log"
    result = run_logged(log, "print('one'); print('two'); raise SystemExit(1)")
    assert result.returncode == 1
    assert result.stdout == "one\ntwo\n"  # tests failed: pytest's own summary says it, nothing added
    assert log.read_text() == "one\ntwo\n"


def test_a_command_killed_by_a_signal_is_said_with_the_logs_path(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    result = run_logged(
        log, "import os, signal; print('before', flush=True); os.kill(os.getpid(), signal.SIGKILL)"
    )
    assert result.returncode == 128 + signal.SIGKILL
    assert "before\n" in log.read_text()
    assert f"the command was killed by SIGKILL after 0 s; all it printed is in {log}" in result.stdout


def test_pytests_own_error_statuses_are_named(tmp_path: Path) -> None:
    result = run_logged(tmp_path / "run.log", "raise SystemExit(3)")
    assert result.returncode == 3
    assert "exited 3 (internal error)" in result.stdout


# A command that says "ready", then waits; on SIGTERM it prints its summary and exits 2, as pytest does.
SUMMARY_ON_SIGTERM = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *a: (print('summary', flush=True), sys.exit(2)))\n"
    "print('ready', flush=True)\n"
    "time.sleep(30)\n"
)


def start_summary_on_sigterm(log: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), str(log), "--", sys.executable, "-c", SUMMARY_ON_SIGTERM],
        stdout=subprocess.PIPE,
        text=True,
    )


def test_sigterm_reaches_the_command_which_still_prints_its_summary(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    proc = start_summary_on_sigterm(log)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    rest = proc.stdout.read()
    assert proc.wait(timeout=20) == 2
    assert time.monotonic() - began < 10
    assert rest.startswith("summary\n")
    assert "exited 2 (interrupted)" in rest
    assert log.read_text().startswith("ready\nsummary\n")


def test_sigterm_reaches_the_command_when_the_caller_blocked_it(tmp_path: Path) -> None:
    """A blocked signal is inherited across fork and exec. A pytest worker that had SIGTERM blocked when
    it started run_logged left both run_logged and its command deaf to it (the flake: the command slept
    its 30 s and exited 0); run_logged unblocks the signals it promises to pass on."""
    log = tmp_path / "run.log"
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    try:
        proc = start_summary_on_sigterm(log)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(timeout=10) == 2
    finally:
        proc.kill()
    assert proc.stdout.read().startswith("summary\n")
