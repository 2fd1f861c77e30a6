"""Run and stop the `make run` demo: one demo per checkout, and an honest word on what keeps running.

    python scripts/demo.py run --host H --port P -- <command starting every process (honcho)>
    python scripts/demo.py stop

`run` first stops a demo that already runs from this checkout (var/run/demo.json names its pid), refuses
a console port that another program holds, then runs the command until Ctrl-C, `make stop` or another
`make run`. After Ctrl-C it lists what is still running on purpose: the engines (a new `make run`
re-adopts them) and servers scripts/local_services.py started. `stop` ends a running demo's processes;
`make stop` then ends the engines (manage.py stop_engines). Standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PID_FILE = REPO / "var" / "run" / "demo.json"
SERVICES_DIR = REPO / "var" / "services"
STOP_WAIT_SECONDS = 20.0


def say(message: str) -> None:
    print(f"make run: {message}", flush=True)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def running_demo() -> dict[str, Any] | None:
    """The demo recorded in the pid file, if its process still runs (and is this script, not a reused pid)."""
    try:
        info = json.loads(PID_FILE.read_text())
        pid = int(info["pid"])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return info if alive(pid) and b"demo.py" in cmdline else None


def stop_demo(info: dict[str, Any]) -> bool:
    """SIGTERM a running demo and wait until it has stopped its processes; True when it is gone."""
    pid = int(info["pid"])
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT_SECONDS
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not alive(pid)


def port_is_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def engines_still_running() -> list[dict[str, Any]]:
    """Engine records (nodes/process.py writes them) whose process still runs with its start token."""
    directory = Path(os.environ.get("ENGINE_LOG_DIR") or REPO / "var" / "engines")
    found = []
    for path in sorted(directory.glob("*/deployment-*.json")):
        try:
            record = json.loads(path.read_text())
            environ = Path(f"/proc/{int(record['pid'])}/environ").read_bytes()
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if f"INFERCHAIN_START_TOKEN={record.get('start_token')}".encode() in environ.split(b"\0"):
            found.append({**record, "host": path.parent.name})
    return found


def services_still_running() -> list[dict[str, Any]]:
    """Servers scripts/local_services.py started (it records them) that still answer on their port."""
    found = []
    for path in sorted(SERVICES_DIR.glob("*.json")):
        try:
            info = json.loads(path.read_text())
            with socket.create_connection(("127.0.0.1", int(info["port"])), timeout=1.0):
                found.append(info)
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return found


def what_keeps_running() -> list[str]:
    lines = []
    engines = engines_still_running()
    if engines:
        listed = ", ".join(f"{e['host']}:{e['port']} (pid {e['pid']})" for e in engines)
        lines.append(
            f"  {len(engines)} engine(s) on purpose: {listed}. The next make run re-adopts them; "
            "make stop ends them."
        )
    for service in services_still_running():
        lines.append(
            f"  {service['what']} on port {service['port']}, started for make run/test "
            f"(to stop it: {service['stop']})"
        )
    return lines


def run(host: str, port: int, command: list[str]) -> int:
    previous = running_demo()
    if previous is not None:
        say(
            f"a demo already runs from this checkout (pid {previous['pid']}, "
            f"http://{previous['host']}:{previous['port']}/); stopping it so that only one runs."
        )
        if not stop_demo(previous):
            say(f"ERROR: the running demo (pid {previous['pid']}) did not stop; end it and retry.")
            return 1
    if not port_is_free(host, port):
        say(
            f"ERROR: port {port} on {host} is in use by another program. "
            f"Stop it, or pick another address: PORT={port + 1} make run (HOST= sets the interface)."
        )
        return 1

    print(f"\n  inferchain console: http://{host}:{port}/   (API docs: http://{host}:{port}/api/docs/)")
    print("  demo login: admin / inferchain-demo")
    print("  Ctrl-C stops the console processes; the engines keep running until make stop.\n", flush=True)

    reason: list[str] = []
    children: list[subprocess.Popen[bytes]] = []

    def on_signal(signum: int, _frame: Any) -> None:
        reason.append(signal.Signals(signum).name)
        # Ctrl-C reaches the child from the terminal already; SIGTERM (make stop) comes to us only.
        if signum == signal.SIGTERM:
            for child in children:
                with contextlib.suppress(ProcessLookupError):
                    child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    # honcho gives every process its own PORT; WEB_PORT tells the demo traffic where the proxy is.
    child = subprocess.Popen(
        command, env={**os.environ, "HOST": host, "PORT": str(port), "WEB_PORT": str(port)}
    )
    children.append(child)
    if "SIGTERM" in reason:  # it came before the child existed
        child.send_signal(signal.SIGTERM)
    PID_FILE.parent.mkdir(parents=True, exist_ok=True)
    PID_FILE.write_text(json.dumps({"pid": os.getpid(), "host": host, "port": port}))
    try:
        code = child.wait()
    finally:
        with contextlib.suppress(FileNotFoundError):
            PID_FILE.unlink()
    if "SIGTERM" in reason:
        say("stopped (asked by make stop or another make run).")
        return 0
    why = "Ctrl-C" if reason else f"a process exited (code {code})"
    say(f"{why}: the console, worker, beat and node agents have stopped.")
    lines = what_keeps_running()
    if lines:
        print("  Still running:\n" + "\n".join(lines), flush=True)
    else:
        print("  Nothing of the demo is left running.", flush=True)
    return 0 if reason else code


def stop() -> int:
    info = running_demo()
    if info is None:
        print("make stop: no make run demo is running from this checkout.")
        return 0
    print(
        f"make stop: stopping the make run demo (pid {info['pid']}, http://{info['host']}:{info['port']}/)."
    )
    if not stop_demo(info):
        print(
            f"make stop: ERROR: the demo (pid {info['pid']}) did not stop within {STOP_WAIT_SECONDS:.0f} s."
        )
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True)
    run_parser = sub.add_parser("run", help="run the demo's processes (the command after --)")
    run_parser.add_argument("--host", default="127.0.0.1")
    run_parser.add_argument("--port", type=int, default=8000)
    run_parser.add_argument("command", nargs=argparse.REMAINDER)
    sub.add_parser("stop", help="stop the running demo's processes")
    options = parser.parse_args(argv)
    if options.action == "stop":
        return stop()
    command = options.command[1:] if options.command[:1] == ["--"] else options.command
    if not command:
        parser.error("run needs the command to start, after --")
    return run(options.host, options.port, command)


if __name__ == "__main__":
    sys.exit(main())
