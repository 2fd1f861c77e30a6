"""A minute of the demo at rest (make run's processes from the Procfile, background traffic on) logs no
traceback and fewer than 10 lines per minute per process at INFO, and a clean stop prints nothing alarming.

Runs the real processes (web, worker, beat, both node agents and their engines) on a scratch SQLite
database, a Redis key prefix of its own, free ports and temporary directories, so a developer's demo is
untouched. Start-up lines (banners, engine launches) are not counted: the window opens once the engines
are up.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WINDOW_SECONDS = 60.0
PROCESSES = ("web", "worker", "beat", "agent-a", "agent-b", "traffic")
ALARMING = ("Traceback", "ERROR", "CRITICAL", "never awaited", "cannot schedule new futures")

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_port_block(size: int) -> int:
    """The first of `size` consecutive free loopback ports."""
    for _ in range(50):
        base = free_port()
        if base + size > 65535:
            continue
        ports = []
        try:
            for port in range(base, base + size):
                sock = socket.socket()
                ports.append(sock)
                sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for sock in ports:
                sock.close()
        return base
    raise RuntimeError("no block of free ports")


def manage(env: dict[str, str], *args: str) -> None:
    subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, check=True, capture_output=True)


def test_idle_demo_is_quiet(tmp_path: Path) -> None:
    bin_dir = Path(sys.executable).parent
    web_port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "REDIS_KEY_PREFIX": f"idle{uuid.uuid4().hex[:8]}:",
        "ENGINE_LOG_DIR": str(tmp_path / "engines"),
        "AGENT_TOKEN_DIR": str(tmp_path / "agent-tokens"),
        "MODEL_ROOTS": str(tmp_path / "models"),
        "DEMO_ENGINE_PORT_BASE": str(free_port_block(4)),
        "HOST": "127.0.0.1",
        "PORT": str(web_port),
        "WEB_PORT": str(web_port),
        "LOG_LEVEL": "INFO",
        "PYTHONUNBUFFERED": "1",
    }
    (tmp_path / "models").mkdir()
    manage(env, "migrate", "--noinput")
    manage(env, "seed_demo")
    # The repo's Procfile, with this interpreter's bin directory and beat's schedule in the tmp dir.
    procfile = (ROOT / "Procfile").read_text().replace(".venv/bin/", f"{bin_dir}/")
    procfile = procfile.replace("var/celerybeat-schedule", str(tmp_path / "celerybeat-schedule"))
    (tmp_path / "Procfile").write_text(procfile)
    log_path = tmp_path / "honcho.log"
    with log_path.open("w") as log:
        honcho = subprocess.Popen(
            [
                str(bin_dir / "honcho"),
                "start",
                "-f",
                str(tmp_path / "Procfile"),
                "-d",
                str(ROOT),
                "--no-colour",
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            text = log_path.read_text()
            if text.count("launched deployment") >= 3 and "celery@" in text:
                break
            assert honcho.poll() is None, text[-3000:]
            time.sleep(1)
        else:
            pytest.fail("the demo did not start within 120 s:\n" + log_path.read_text()[-3000:])
        time.sleep(20)  # engines come up, first probes and telemetry settle
        start = len(log_path.read_text())
        time.sleep(WINDOW_SECONDS)
        window = log_path.read_text()[start:]
    finally:
        os.killpg(honcho.pid, signal.SIGINT)
        try:
            honcho.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(honcho.pid, signal.SIGKILL)
        manage(env, "stop_engines")
    everything = log_path.read_text()

    per_process: Counter[str] = Counter()
    for line in window.splitlines():
        match = re.match(r"^\S+ (\S+)\.\d+\s+\|", line)
        if match:
            per_process[match.group(1)] += 1
    for name in PROCESSES:
        assert per_process[name] < 10, f"{name} logged {per_process[name]} lines in a minute:\n{window}"
    alarming = [line for line in everything.splitlines() if any(word in line for word in ALARMING)]
    assert alarming == [], "\n".join(alarming)
