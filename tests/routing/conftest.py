"""Fixtures for the proxy: real proxy processes (uvicorn) in front of a trivial backend or simulators.

Proxies run as subprocesses against this run's test database and Redis prefix, so tests that create
rows must use `transactional_db` (committed data is what another process can see).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from console.models import Quota, Tenant
from console.services import issue_api_key
from tests.ports import free_port
from tests.routing.fleet import FleetMember, start_member

REPO = Path(__file__).resolve().parents[2]


def wait_http(url: str, proc: subprocess.Popen[bytes], log_path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited: {log_path.read_text(errors='replace')[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"not ready in {timeout}s: {log_path.read_text(errors='replace')[-3000:]}")


@dataclass
class Proc:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture
def trivial_backend() -> Iterator[Proc]:
    port = free_port()
    log_path = Path(tempfile.mkstemp(prefix="trivial-", suffix=".log")[1])
    with log_path.open("wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, str(REPO / "benchmarks" / "trivial_backend.py"), "--port", str(port)],
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    handle = Proc(proc, port, log_path)
    try:
        wait_http(f"{handle.url}/health", proc, log_path, 10)
        yield handle
    finally:
        handle.stop()


def proxy_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    db = settings.DATABASES["default"]
    env = dict(os.environ)
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "inferchain.settings",
            "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
            "REDIS_KEY_PREFIX": settings.REDIS_KEY_PREFIX,
            "REDIS_URL": settings.REDIS_URL,
            "API_KEY_HMAC_SECRET": settings.API_KEY_HMAC_SECRET,
            "SECRET_KEY": settings.SECRET_KEY,
            "REQUEST_LOG_SPOOL_DIR": tempfile.mkdtemp(prefix="spool-"),
        }
    )
    env.update(extra or {})
    return env


@pytest.fixture
def start_proxy(transactional_db: None) -> Iterator[Callable[..., Proc]]:
    """Start proxy processes (`python -m routing.proxy`); each is stopped at teardown."""
    started: list[Proc] = []
    # The subprocess must see the test database, which exists once pytest-django created it.
    connection.ensure_connection()

    def start(static: str = "", **env: str) -> Proc:
        port = free_port()
        log_path = Path(tempfile.mkstemp(prefix="proxy-", suffix=".log")[1])
        extra = {"PROXY_STATIC_ENDPOINTS": static, **env}
        with log_path.open("wb") as fh:
            proc = subprocess.Popen(
                [sys.executable, "-m", "routing.proxy", "--port", str(port), "--log-level", "info"],
                cwd=REPO,
                env=proxy_env(extra),
                stdout=fh,
                stderr=subprocess.STDOUT,
            )
        handle = Proc(proc, port, log_path)
        started.append(handle)
        wait_http(f"{handle.url}/healthz", proc, log_path)
        return handle

    yield start
    for handle in started:
        handle.stop()


@dataclass
class TenantKey:
    tenant: Tenant
    raw_key: str
    api_key: Any


def make_tenant_key(name: str = "acme", scopes: list[str] | None = None, **limits: Any) -> TenantKey:
    tenant = Tenant.objects.create(name=name)
    if limits:
        Quota.objects.create(tenant=tenant, **limits)
    issued = issue_api_key(tenant=tenant, name=f"{name} key", scopes=scopes)
    return TenantKey(tenant=tenant, raw_key=issued.raw_key, api_key=issued.api_key)


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    text: str

    def json(self) -> Any:
        import json

        return json.loads(self.text)


def post(
    url: str,
    key: str | None,
    body: Any = None,
    raw: bytes | None = None,
    timeout: float = 10,
    headers: dict[str, str] | None = None,
) -> Reply:
    """POST JSON (or raw bytes) with an optional bearer key; any status comes back as a Reply."""
    import json
    import urllib.error

    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
    if key is not None:
        req.add_header("Authorization", f"Bearer {key}")
    for name, value in (headers or {}).items():
        req.add_header(name, value)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return Reply(resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read().decode())
    except urllib.error.HTTPError as err:
        return Reply(err.code, {k.lower(): v for k, v in err.headers.items()}, err.read().decode())


@pytest.fixture
def three_sims(transactional_db: None, redis_clean: None) -> Iterator[list[FleetMember]]:
    """Three ready simulator deployments serving `llama`, stopped at teardown."""
    members = [start_member("llama") for _ in range(3)]
    yield members
    for member in members:
        member.sim.stop()
