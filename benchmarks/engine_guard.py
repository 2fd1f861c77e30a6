"""What each way of closing the engine port costs per streamed token, measured side by side in one run.

    .venv/bin/python benchmarks/engine_guard.py [--tokens 256] [--clients 8] [--seconds 4] [--reps 3]

The engine stand-in is an ASGI app under uvicorn (vLLM's server stack: a pure-ASGI app, uvicorn,
httptools, uvloop) that streams `--tokens` SSE chunks per request, one chunk per token, shaped like
vLLM's chat chunks. Four ways to put it behind the engine key, each in its own processes:

- `open`: no check at all (today's /invocations);
- `guard`: nodes/engines/guard.py's EngineKeyGuard as ASGI middleware in the engine process (what the
  adapters do with vLLM's `--middleware`);
- `relay`: the engine on loopback behind an authenticating relay (aiohttp: check the key, forward,
  re-stream every chunk), the shape an agent-side relay would have;
- `mtls`: uvicorn with `--ssl-keyfile/--ssl-certfile/--ssl-ca-certs/--ssl-cert-reqs 2` (vLLM's own
  flags), the client presenting a fleet client certificate over pooled keep-alive connections.

A client (aiohttp, `--clients` concurrent streams, connections pooled as the proxy's are) reads whole
streams for `--seconds`; per cell: tokens/s and the server-side CPU time per token (user + system of
the engine and relay processes, from /proc). Reps are interleaved across mechanisms and medians
reported; ratios are against `open` in the same run. Results: a Markdown table on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[1]
KEY = "bench-engine-key-" + "x" * 32
MECHANISMS = ("open", "guard", "relay", "mtls")
CHUNK = (
    b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":" tok"},"logprobs":null,"finish_reason":null}]}\n\n'
)

ENGINE_APP = """
import os
TOKENS = int(os.environ["BENCH_TOKENS"])
CHUNK = {chunk!r}

async def engine(scope, receive, send):
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({{"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream")]}})
    for _ in range(TOKENS):
        await send({{"type": "http.response.body", "body": CHUNK, "more_body": True}})
    await send({{"type": "http.response.body", "body": b"data: [DONE]\\n\\n", "more_body": False}})

if os.environ.get("BENCH_GUARD") == "1":
    from nodes.engines.guard import EngineKeyGuard
    app = EngineKeyGuard(engine)
else:
    app = engine
"""

RELAY = """
import sys, aiohttp, uvloop
from aiohttp import web
from nodes.engines.guard import authorized, key_digests
upstream, port, key = sys.argv[1], int(sys.argv[2]), sys.argv[3]
digests = key_digests(key)

async def relay(request):
    if not authorized(request.headers.get("Authorization", "").encode("latin-1"), digests):
        return web.Response(status=401, body=b'{"error":"Unauthorized"}', content_type="application/json")
    body = await request.read()
    async with request.app["session"].request(request.method, upstream + request.path_qs, data=body,
                                              headers={"Content-Type": "application/json"}) as up:
        kind = up.headers.get("Content-Type", "")
        resp = web.StreamResponse(status=up.status, headers={"Content-Type": kind})
        await resp.prepare(request)
        async for chunk in up.content.iter_any():
            await resp.write(chunk)
        await resp.write_eof()
        return resp

async def make():
    app = web.Application()
    app["session"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    app.router.add_route("*", "/{tail:.*}", relay)
    return app

uvloop.install()
web.run_app(make(), host="127.0.0.1", port=port, access_log=None, print=None)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def make_certs(directory: Path) -> dict[str, Path]:
    """A fleet CA, a server certificate for 127.0.0.1 and a client certificate, all signed by the CA."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)

    def key_pem(key: Any, name: str) -> Path:
        path = directory / name
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        return path

    def cert(subject: str, key: Any, issuer: Any, issuer_key: Any, ca: bool, san: bool) -> Any:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if san:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False,
            )
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fleet-ca")])
    ca_cert = cert("fleet-ca", ca_key, ca_name, ca_key, True, False)
    out = {"ca": directory / "ca.pem"}
    out["ca"].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    for name in ("server", "client"):
        key = ec.generate_private_key(ec.SECP256R1())
        crt = cert(name, key, ca_name, ca_key, False, name == "server")
        out[f"{name}_key"] = key_pem(key, f"{name}.key")
        out[f"{name}_cert"] = directory / f"{name}.pem"
        out[f"{name}_cert"].write_bytes(crt.public_bytes(serialization.Encoding.PEM))
    return out


def client_context(certs: dict[str, Path]) -> ssl.SSLContext:
    """The proxy's side of mTLS: trusts the fleet CA and presents the fleet client certificate."""
    ctx = ssl.create_default_context(cafile=str(certs["ca"]))
    ctx.load_cert_chain(str(certs["client_cert"]), str(certs["client_key"]))
    return ctx


class Target:
    def __init__(self, mechanism: str, tokens: int, work: Path, certs: dict[str, Path]) -> None:
        self.mechanism = mechanism
        self.procs: list[subprocess.Popen[bytes]] = []
        env = {**os.environ, "PYTHONPATH": str(REPO), "BENCH_TOKENS": str(tokens)}
        env["BENCH_GUARD"] = "1" if mechanism == "guard" else "0"
        env["VLLM_API_KEY"] = KEY
        port = free_port()
        argv = [sys.executable, "-m", "uvicorn", "engine_app:app", "--port", str(port), "--host", "127.0.0.1"]
        argv += ["--loop", "uvloop", "--http", "httptools", "--no-access-log", "--log-level", "warning"]
        argv += ["--app-dir", str(work)]
        scheme = "http"
        if mechanism == "mtls":
            argv += ["--ssl-keyfile", str(certs["server_key"]), "--ssl-certfile", str(certs["server_cert"])]
            argv += ["--ssl-ca-certs", str(certs["ca"]), "--ssl-cert-reqs", str(int(ssl.CERT_REQUIRED))]
            scheme = "https"
        self.procs.append(subprocess.Popen(argv, env=env))
        self.url = f"{scheme}://127.0.0.1:{port}"
        if mechanism == "relay":
            relay_port = free_port()
            relay = [sys.executable, str(work / "relay.py"), self.url, str(relay_port), KEY]
            self.procs.append(subprocess.Popen(relay, env=env, stderr=subprocess.DEVNULL))
            self.url = f"http://127.0.0.1:{relay_port}"
        self.ssl: ssl.SSLContext | bool = client_context(certs) if mechanism == "mtls" else False

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()


async def one_stream(session: aiohttp.ClientSession, target: Target, key: str | None) -> tuple[int, int]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    async with session.post(target.url + "/invocations", data=b"{}", headers=headers, ssl=target.ssl) as resp:
        tokens = 0
        async for line in resp.content:
            if line.startswith(b'data: {"id"'):
                tokens += 1
        return resp.status, tokens


async def wait_up(target: Target) -> None:
    deadline = time.monotonic() + 30
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                status, _ = await one_stream(session, target, KEY)
                if status == 200:
                    return
            except (aiohttp.ClientError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{target.mechanism} did not come up")
            await asyncio.sleep(0.1)


async def cell(target: Target, clients: int, seconds: float) -> tuple[float, float]:
    """Tokens/s and server CPU microseconds per token."""
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(one_stream(session, target, KEY) for _ in range(clients)))  # warm the pool
        pids = [p.pid for p in target.procs]
        cpu0, t0 = cpu_seconds(pids), time.monotonic()
        tokens = 0
        end = t0 + seconds

        async def worker() -> None:
            nonlocal tokens
            while time.monotonic() < end:
                status, n = await one_stream(session, target, KEY)
                assert status == 200, status
                tokens += n

        await asyncio.gather(*(worker() for _ in range(clients)))
        wall, cpu = time.monotonic() - t0, cpu_seconds(pids) - cpu0
    return tokens / wall, cpu / tokens * 1e6


async def refused(target: Target, certs: dict[str, Path]) -> int:
    """The status a caller without the credential gets: no key, and for mtls no client certificate."""
    if target.mechanism == "mtls":
        target.ssl = ssl.create_default_context(cafile=str(certs["ca"]))  # trusts the engine, has no cert
    async with aiohttp.ClientSession() as session:
        try:
            status, _ = await one_stream(session, target, None)
            return status
        except (aiohttp.ClientError, OSError, ssl.SSLError):
            return 0  # the TLS handshake refused a client without a certificate


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="engine-guard-bench-"))
    (work / "engine_app.py").write_text(ENGINE_APP.format(chunk=CHUNK))
    (work / "relay.py").write_text(RELAY)
    certs = make_certs(work)
    targets = {m: Target(m, args.tokens, work, certs) for m in MECHANISMS}
    results: dict[str, list[tuple[float, float]]] = {m: [] for m in MECHANISMS}
    try:
        for target in targets.values():
            asyncio.run(wait_up(target))
        without_key = {m: asyncio.run(refused(t, certs)) for m, t in targets.items()}
        targets["mtls"].ssl = client_context(certs)
        for _ in range(args.reps):
            for m, target in targets.items():
                results[m].append(asyncio.run(cell(target, args.clients, args.seconds)))
    finally:
        for target in targets.values():
            target.stop()
    base_tps = statistics.median(r[0] for r in results["open"])
    base_cpu = statistics.median(r[1] for r in results["open"])
    runs = f"{args.seconds:g} s x {args.reps} reps"
    print(f"{args.tokens} tokens/stream, {args.clients} clients, {runs}, interleaved\n")
    print(
        "| mechanism | without the credential | tokens/s (median) | vs open | server CPU us/token (median) |",
        end="",
    )
    print(" extra us/token |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for m in MECHANISMS:
        tps = statistics.median(r[0] for r in results[m])
        cpu = statistics.median(r[1] for r in results[m])
        status = {0: "handshake refused", 200: "200 (open)"}.get(without_key[m], str(without_key[m]))
        print(f"| {m} | {status} | {tps:,.0f} | {tps / base_tps:.2f} | {cpu:.2f} | {cpu - base_cpu:+.2f} |")


if __name__ == "__main__":
    main()
