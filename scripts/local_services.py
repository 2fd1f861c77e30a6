"""Make sure the Redis and PostgreSQL that `make run` / `make test` point at answer, starting local ones.

    python3 scripts/local_services.py --redis "$REDIS_URL" [--postgres "$DATABASE_URL"]

For each URL: if something answers there, nothing is done. If it names another machine, nothing is
started (that server is the user's business). If it names this machine (localhost, 127.x, ::1) and
nothing answers, a server is started on that port, after installing the Debian package (`redis-server`,
`postgresql`) when it is missing and we are root. Every action is printed. Standard library only, so
it runs before the virtual environment exists (.ci/run, a fresh machine).

Servers started here keep running after `make run` ends; what was started is recorded under
var/services/ (and listed when `make run` stops).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parent.parent
WAIT_SECONDS = 30.0


class SetupError(Exception):
    """A server could not be made to answer; the message says what to do."""


def say(message: str) -> None:
    print(f"services: {message}", flush=True)


def is_local(host: str) -> bool:
    if host in ("", "localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _exchange(host: str, port: int, payload: bytes) -> bytes:
    """Send `payload` and return the first bytes of the reply; b"" when nothing listens or answers."""
    try:
        with socket.create_connection((host or "localhost", port), timeout=2.0) as sock:
            sock.sendall(payload)
            return sock.recv(64)
    except OSError:
        return b""


def redis_answers(host: str, port: int) -> bool:
    # Any RESP reply counts: "+PONG", or "-NOAUTH ..." from a Redis that wants a password.
    return _exchange(host, port, b"PING\r\n")[:1] in (b"+", b"-")


def postgres_answers(host: str, port: int) -> bool:
    # The SSLRequest packet: a PostgreSQL server answers one byte, "S" or "N".
    return _exchange(host, port, (8).to_bytes(4, "big") + (80877103).to_bytes(4, "big")) in (b"S", b"N")


def wait_until(check: Callable[[str, int], bool], host: str, port: int) -> bool:
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        if check(host, port):
            return True
        time.sleep(0.2)
    return False


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def apt_install(package: str, why: str) -> None:
    """Install a Debian package as `make chromium` does; refuse clearly when we cannot."""
    if not (is_root() and shutil.which("apt-get")):
        raise SetupError(f"{why} Install it (as root: apt-get install {package}) and run this again.")
    say(f"{why} Installing the Debian package {package} (apt-get) ...")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", package], check=True, env=env)


def record(state_dir: Path, name: str, info: dict[str, object]) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / f"{name}.json").write_text(json.dumps(info))


# --- Redis --------------------------------------------------------------------------------------


def ensure_redis(url: str, state_dir: Path) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        say(f"REDIS_URL is not a redis:// URL ({parts.scheme}://...): starting nothing.")
        return
    host, port = parts.hostname or "", parts.port or 6379
    if not is_local(host):
        say(f"Redis at {host}:{port} is not on this machine: starting nothing.")
        return
    if redis_answers(host, port):
        say(f"Redis answers at {host or 'localhost'}:{port}.")
        return
    if shutil.which("redis-server") is None:
        apt_install("redis-server", "No Redis answers and redis-server is not installed.")
    binds = {"": "127.0.0.1 -::1", "localhost": "127.0.0.1 -::1"}.get(host, host)
    state_dir.mkdir(parents=True, exist_ok=True)
    log = state_dir / f"redis-{port}.log"
    pidfile = state_dir / f"redis-{port}.pid"
    # An in-memory server: the demo's and the tests' Redis data is disposable.
    subprocess.run(
        [
            *("redis-server", "--daemonize", "yes", "--bind", *binds.split(), "--port", str(port)),
            *("--save", "", "--appendonly", "no", "--dir", str(state_dir)),
            *("--logfile", str(log), "--pidfile", str(pidfile)),
        ],
        check=True,
    )
    if not wait_until(redis_answers, host, port):
        raise SetupError(f"Started redis-server on port {port}, but it does not answer; see {log}.")
    pid = pidfile.read_text().strip() if pidfile.exists() else "?"
    stop = f"redis-cli -p {port} shutdown"
    record(state_dir, f"redis-{port}", {"what": "Redis", "port": port, "stop": stop})
    say(
        f"Started Redis on {host or 'localhost'}:{port} (pid {pid}, log {log}); "
        f"it keeps running (to stop it: {stop})."
    )


# --- PostgreSQL ---------------------------------------------------------------------------------


def postgres_bindir() -> Path | None:
    """Debian keeps each major version's binaries under /usr/lib/postgresql/<major>/bin."""
    versions = sorted(
        (p for p in Path("/usr/lib/postgresql").glob("*/bin") if (p / "initdb").exists()),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    if versions:
        return versions[-1]
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def debian_cluster_on(port: int) -> tuple[str, str] | None:
    """(version, name) of the Debian cluster configured on `port`, if pg_lsclusters knows one."""
    if shutil.which("pg_lsclusters") is None:
        return None
    lines = subprocess.run(["pg_lsclusters", "--no-header"], capture_output=True, text=True).stdout
    for line in lines.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == str(port):
            return fields[0], fields[1]
    return None


def install_postgresql() -> None:
    # Without this the package creates a "main" cluster on 5432 that wants passwords over TCP; the
    # cluster created below trusts loopback connections, as the passwordless test URL needs.
    confdir = Path("/etc/postgresql-common/createcluster.d")
    if is_root():
        confdir.mkdir(parents=True, exist_ok=True)
        (confdir / "inferchain.conf").write_text("create_main_cluster = false\n")
    apt_install("postgresql", "No PostgreSQL answers and it is not installed.")


def ensure_postgres(url: str, state_dir: Path) -> None:
    parts = urlsplit(url)
    if not parts.scheme.startswith("postgres"):
        say(f"DATABASE_URL is not a PostgreSQL URL ({parts.scheme}://...): starting nothing.")
        return
    host, port = parts.hostname or "", parts.port or 5432
    if not is_local(host):
        say(f"PostgreSQL at {host}:{port} is not on this machine: starting nothing.")
        return
    if postgres_answers(host, port):
        say(f"PostgreSQL answers at {host or 'localhost'}:{port}.")
        return
    if postgres_bindir() is None:
        install_postgresql()
    bindir = postgres_bindir()
    if bindir is None:
        raise SetupError("PostgreSQL's binaries (initdb) were not found after installing it.")
    if is_root():
        start_debian_cluster(bindir, port, state_dir)
    else:
        start_private_cluster(bindir, host, port, state_dir)
    if not wait_until(postgres_answers, host, port):
        raise SetupError(f"Started PostgreSQL on port {port}, but it does not answer.")


def start_debian_cluster(bindir: Path, port: int, state_dir: Path) -> None:
    """As root: a Debian cluster (runs as user postgres, data under /var/lib/postgresql)."""
    if shutil.which("pg_createcluster") is None:
        raise SetupError("Running as root needs Debian's postgresql-common (pg_createcluster) to start one.")
    cluster = debian_cluster_on(port)
    if cluster is None:
        version, name = bindir.parent.name, f"inferchain-{port}"
        # Trust on loopback and the local socket: a development database, as the test URL expects.
        subprocess.run(
            ["pg_createcluster", "--port", str(port), version, name, "--", "--auth=trust"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        say(f"Created PostgreSQL cluster {version}/{name} on port {port} (trusts local connections).")
    else:
        version, name = cluster
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, name, "start"], check=True)
    stop = f"pg_ctlcluster {version} {name} stop"
    record(state_dir, f"postgres-{port}", {"what": "PostgreSQL", "port": port, "stop": stop})
    say(f"Started PostgreSQL cluster {version}/{name} on port {port}; it keeps running (to stop it: {stop}).")


def start_private_cluster(bindir: Path, host: str, port: int, state_dir: Path) -> None:
    """As a normal user: a cluster of our own under var/, owned by this user."""
    datadir = state_dir / f"postgres-{port}"
    if not (datadir / "PG_VERSION").exists():
        subprocess.run(
            [str(bindir / "initdb"), "-D", str(datadir), "-U", "postgres", "--auth=trust"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        say(f"Created a PostgreSQL cluster in {datadir} (user postgres, trusts local connections).")
    listen = "localhost" if host in ("", "localhost") else host
    log = state_dir / f"postgres-{port}.log"
    options = f"-p {port} -c listen_addresses={listen} -c unix_socket_directories={datadir}"
    subprocess.run(
        [str(bindir / "pg_ctl"), "-D", str(datadir), "-l", str(log), "-o", options, "-w", "start"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    stop = f"{bindir / 'pg_ctl'} -D {datadir} stop"
    record(state_dir, f"postgres-{port}", {"what": "PostgreSQL", "port": port, "stop": stop})
    say(
        f"Started PostgreSQL on {listen}:{port} (data {datadir}, log {log}); "
        f"it keeps running (to stop it: {stop})."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--redis", help="REDIS_URL to make answer")
    parser.add_argument("--postgres", help="DATABASE_URL to make answer (sqlite URLs are left alone)")
    parser.add_argument(
        "--state-dir", type=Path, default=REPO / "var" / "services", help="where started servers live"
    )
    options = parser.parse_args(argv)
    try:
        if options.redis:
            ensure_redis(options.redis, options.state_dir)
        if options.postgres and not options.postgres.startswith("sqlite"):
            ensure_postgres(options.postgres, options.state_dir)
    except (SetupError, subprocess.CalledProcessError) as exc:
        say(f"ERROR: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
