"""Launch simulators from tests and benchmarks: `start_sim(...)` returns a handle with .base_url and .stop().

    from vllm_sim.testing import start_sim

    sim = start_sim("meta-llama/Llama-3.1-8B-Instruct", "--max-model-len", "4096", time_scale=20)
    try:
        ...  # call sim.base_url + "/v1/chat/completions"
    finally:
        sim.stop()

The process runs `python -m vllm_sim serve ...` on a free loopback port; start_sim waits until
/health answers 200 (or raises SimStartError with the tail of its log).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

REPO_ROOT = Path(__file__).resolve().parents[1]


class SimStartError(RuntimeError):
    """The simulator exited or did not become healthy in time."""


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago (bind to port 0 and read it back)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class SimHandle:
    """A running simulator process."""

    proc: subprocess.Popen[bytes]
    port: int
    host: str
    model: str
    api_key: str | None
    log_path: Path
    keep_log: bool = False
    _log: IO[bytes] | None = field(default=None, repr=False)
    _final_log: str | None = field(default=None, repr=False)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def openai_base_url(self) -> str:
        return self.base_url + "/v1"

    def log_text(self) -> str:
        """The process's stdout and stderr so far (kept in memory once the handle is stopped)."""
        if self._final_log is not None:
            return self._final_log
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Block until GET /health answers 200."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SimStartError(
                    f"simulator exited with {self.proc.returncode}:\n{self.log_text()[-3000:]}"
                )
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=1.0) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError, TimeoutError):
                pass
            time.sleep(0.05)
        raise SimStartError(f"simulator not healthy after {timeout}s:\n{self.log_text()[-3000:]}")

    def stop(self, timeout: float = 5.0) -> int | None:
        """Terminate the process (SIGTERM, then SIGKILL) and return its exit code."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        if self._log is not None:
            self._log.close()
            self._log = None
            # The log file is temporary: keep its text on the handle and remove the file.
            self._final_log = self.log_text()
            if not self.keep_log:
                self.log_path.unlink(missing_ok=True)
        return self.proc.returncode


def start_sim(
    model: str = "meta-llama/Llama-3.1-8B-Instruct",
    *extra_args: str,
    port: int | None = None,
    host: str = "127.0.0.1",
    api_key: str | None = None,
    profile: str | None = None,
    time_scale: float | None = None,
    wait: bool = True,
    timeout: float = 30.0,
    cpu: int | None = None,
    env: dict[str, str] | None = None,
    keep_log: bool = False,
    netns: str | None = None,
) -> SimHandle:
    """Start `python -m vllm_sim serve model ...` as a subprocess on a free port.

    extra_args are passed through (vLLM flags or --sim-* knobs); cpu pins the process to one core
    with taskset; netns runs it inside that Linux network namespace (`ip netns exec`, which execs the
    command, so the handle's pid is the simulator's). With wait=False the handle is returned at once
    (for start-up tests). The log file is deleted by stop() unless keep_log; its text stays available
    from log_text().
    """
    port = port or free_port()
    cmd = [sys.executable, "-m", "vllm_sim", "serve", model, "--host", host, "--port", str(port)]
    if profile is not None:
        cmd += ["--sim-profile", profile]
    if time_scale is not None:
        cmd += ["--sim-time-scale", str(time_scale)]
    cmd += list(extra_args)
    if cpu is not None:
        cmd = ["taskset", "-c", str(cpu), *cmd]
    if netns is not None:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    fd, log_name = tempfile.mkstemp(prefix=f"sim-{port}-", suffix=".log")
    os.close(fd)
    log = open(log_name, "wb")  # noqa: SIM115 - closed by SimHandle.stop
    proc_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    if env is None or "VLLM_API_KEY" not in env:
        # A key inherited from the caller's environment would silently guard the simulator.
        proc_env.pop("VLLM_API_KEY", None)
    if api_key is not None:
        # As the agent passes it: in the environment, never on the command line (`ps` shows argv).
        proc_env["VLLM_API_KEY"] = api_key
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, env=proc_env)
    handle = SimHandle(
        proc=proc,
        port=port,
        host=host,
        model=model,
        api_key=api_key,
        log_path=Path(log_name),
        keep_log=keep_log,
        _log=log,
    )
    if wait:
        try:
            handle.wait_healthy(timeout)
        except BaseException:
            handle.stop()
            raise
    return handle


@contextlib.contextmanager
def running_sim(
    model: str = "meta-llama/Llama-3.1-8B-Instruct", *extra_args: str, **kwargs: object
) -> Iterator[SimHandle]:
    """Context-manager form of start_sim: the process is stopped on exit."""
    handle = start_sim(model, *extra_args, **kwargs)  # type: ignore[arg-type]
    try:
        yield handle
    finally:
        handle.stop()
