"""Run a command with its output shown and kept in a file, and say how it ended when it did not end well.

    python3 scripts/run_logged.py var/test-logs/pytest.log -- .venv/bin/pytest ...

`make test` runs pytest through this. A CI log shows only the tail of what a run printed, and a pytest
that dies (killed for memory, by a timeout around it, or by a crash of its own) leaves no summary: one
CI run ended with exit 2 and nothing to read. Here every line also goes to the log file as it comes,
a SIGTERM or SIGINT is passed on to the command (so pytest still prints its summary), and an end by a
signal, or by an exit status pytest uses for its own errors, is said in one line with the log's path.
Standard library only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

# The signals passed on to the command (a CI runner's timeout sends SIGTERM, a developer's ^C SIGINT).
PASSED_ON = (signal.SIGTERM, signal.SIGINT)
# pytest's exit statuses other than 0 (passed) and 1 (tests failed): interrupted, internal error, usage
# error, no tests collected.
PYTEST_OWN_ERRORS = {2: "interrupted", 3: "internal error", 4: "usage error", 5: "no tests collected"}


def describe_end(returncode: int, seconds: float, log: Path) -> str | None:
    """One line on how the command ended, or None when it passed or only tests failed."""
    took = f"after {seconds:.0f} s"
    if returncode < 0:
        name = signal.Signals(-returncode).name
        return f"run_logged: the command was killed by {name} {took}; all it printed is in {log}"
    if returncode in PYTEST_OWN_ERRORS:
        what = PYTEST_OWN_ERRORS[returncode]
        return f"run_logged: the command exited {returncode} ({what}) {took}; all it printed is in {log}"
    return None


def run(log: Path, argv: list[str]) -> int:
    log.parent.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    # A blocked signal is inherited across fork and exec: a caller that had SIGTERM blocked (one CI run's
    # pytest worker did) would leave this process and the command deaf to it, and the command would run
    # to its end. Unblocked before the command starts, so it inherits the open mask too.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, PASSED_ON)
    with log.open("wb") as kept:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

        def pass_on(signum: int, _frame: FrameType | None) -> None:
            proc.send_signal(signum)

        for signum in PASSED_ON:
            signal.signal(signum, pass_on)
        assert proc.stdout is not None
        out = sys.stdout.buffer
        for line in iter(proc.stdout.readline, b""):
            out.write(line)
            out.flush()
            kept.write(line)
            kept.flush()
        returncode = proc.wait()
    message = describe_end(returncode, time.monotonic() - began, log)
    if message:
        print(message, flush=True)
    # A shell's convention for a death by signal, so `make` fails as it would have.
    return 128 - returncode if returncode < 0 else returncode


def main() -> int:
    args = sys.argv[1:]
    if len(args) < 3 or args[1] != "--":
        print("usage: run_logged.py LOG -- COMMAND [ARG ...]", file=sys.stderr)
        return 2
    return run(Path(args[0]), args[2:])


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
