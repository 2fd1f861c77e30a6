"""Engine processes at the OS level: start in their own session, find again after an agent restart, stop.

An engine outlives the agent that started it (its own session, its output in a file, not a pipe),
so an agent restart never takes the fleet down; the agent re-adopts it from a small state file and
the process's environment, which carries the deployment's start token.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

START_TOKEN_ENV = "INFERCHAIN_START_TOKEN"
DEPLOYMENT_ENV = "INFERCHAIN_DEPLOYMENT_ID"

# Popen objects of engines this process started, so their exit status is reaped (no zombies).
_children: dict[int, subprocess.Popen[bytes]] = {}
_children_lock = threading.Lock()


@dataclass
class EngineRecord:
    """What the agent writes next to the log when it starts an engine, to find it again later."""

    deployment_id: int
    pid: int
    port: int
    start_token: str
    log_path: str
    started_at: float


def state_file(directory: Path, deployment_id: int) -> Path:
    return directory / f"deployment-{deployment_id}.json"


def log_file(directory: Path, deployment_id: int) -> Path:
    return directory / f"deployment-{deployment_id}.log"


def rotate_log(path: Path, keep: int) -> None:
    """Shift path -> path.1 -> ... -> path.<keep>, so each launch starts a fresh file."""
    if not path.exists():
        return
    for i in range(keep - 1, 0, -1):
        older = path.with_name(f"{path.name}.{i}")
        if older.exists():
            older.replace(path.with_name(f"{path.name}.{i + 1}"))
    path.replace(path.with_name(f"{path.name}.1"))


def truncate_if_large(path: Path, max_bytes: int, keep: int) -> bool:
    """Copy-and-truncate a running engine's log when it grows past max_bytes.

    The engine holds the file open in append mode, so truncating in place is safe and it keeps
    writing at the new end; renaming would leave it writing into the rotated file.
    """
    try:
        if path.stat().st_size <= max_bytes:
            return False
    except FileNotFoundError:
        return False
    for i in range(keep - 1, 0, -1):
        older = path.with_name(f"{path.name}.{i}")
        if older.exists():
            older.replace(path.with_name(f"{path.name}.{i + 1}"))
    shutil.copyfile(path, path.with_name(f"{path.name}.1"))
    with path.open("r+b") as handle:
        handle.truncate(0)
    return True


def port_is_free(port: int, host: str = "0.0.0.0") -> bool:
    """Whether a listening socket could bind `port` now (the engine binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def start_engine(
    *,
    argv: list[str],
    env: dict[str, str],
    directory: Path,
    deployment_id: int,
    port: int,
    start_token: str,
    log_keep: int,
) -> EngineRecord:
    """Start an engine in a new session with its own log file, and record how to find it again."""
    directory.mkdir(parents=True, exist_ok=True)
    log_path = log_file(directory, deployment_id)
    rotate_log(log_path, log_keep)
    full_env = {
        **os.environ,
        **env,
        START_TOKEN_ENV: start_token,
        DEPLOYMENT_ENV: str(deployment_id),
        "PYTHONUNBUFFERED": "1",
    }
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
            start_new_session=True,
            close_fds=True,
        )
    with _children_lock:
        _children[proc.pid] = proc
    record = EngineRecord(
        deployment_id=deployment_id,
        pid=proc.pid,
        port=port,
        start_token=start_token,
        log_path=str(log_path),
        started_at=time.time(),
    )
    path = state_file(directory, deployment_id)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(record)))
    tmp.replace(path)
    return record


def read_record(directory: Path, deployment_id: int) -> EngineRecord | None:
    try:
        data = json.loads(state_file(directory, deployment_id).read_text())
        return EngineRecord(**data)
    except (FileNotFoundError, ValueError, TypeError):
        return None


def forget_record(directory: Path, deployment_id: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        state_file(directory, deployment_id).unlink()


def is_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not count)."""
    with _children_lock:
        child = _children.get(pid)
    if child is not None:
        if child.poll() is None:
            return True
        with _children_lock:
            _children.pop(pid, None)
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    # Field 3 (after the parenthesised command name) is the state; Z is a zombie, X is dead.
    state = stat.rsplit(")", 1)[-1].split()[0]
    return state not in ("Z", "X")


def exit_code(pid: int) -> int | None:
    """The exit status of an engine this process started, once it has exited."""
    with _children_lock:
        child = _children.get(pid)
    return None if child is None else child.poll()


def carries_token(pid: int, start_token: str) -> bool:
    """Whether process `pid` was started with `start_token`: a reused pid never passes this."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{START_TOKEN_ENV}={start_token}".encode() in environ.split(b"\0")


def signal_group(pid: int, sig: int) -> None:
    """Send `sig` to the engine's whole session (vLLM starts worker processes of its own)."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        return
    except PermissionError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def stop_engine(pid: int, timeout: float) -> bool:
    """SIGTERM the engine's process group, wait up to `timeout`, then SIGKILL. True if it was forced."""
    signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not is_alive(pid):
            return False
        time.sleep(0.05)
    signal_group(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and is_alive(pid):
        time.sleep(0.05)
    return True


def tail(path: str | Path, lines: int = 40, max_bytes: int = 64 * 1024) -> str:
    """The last `lines` lines of a log file (reads only its end)."""
    try:
        with Path(path).open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            data = handle.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def session_pids(sid: int) -> list[int]:
    """The processes of session `sid` (Ray starts some workers in process groups of their own)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        # After the command name: state, ppid, pgrp, session.
        if len(fields) > 3 and int(fields[3]) == sid and fields[0] not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def kill_session(sid: int) -> int:
    """SIGKILL every process left in session `sid`; how many there were."""
    pids = session_pids(sid)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)
