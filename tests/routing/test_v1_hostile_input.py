"""Hostile `/v1/` requests: quotes and SQL in Authorization, huge and invalid-UTF-8 headers, invalid
UTF-8 and deeply nested bodies, wrong content types, huge numbers, odd methods and paths. Sent as raw
bytes to the standalone proxy and to the web process's `/v1/` mount: no answer is a 5xx, none carries a
stack trace, every refusal is JSON, and nothing a hostile request sends reaches the engine.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import start_console
from tests.routing.conftest import Proc, TenantKey, make_tenant_key

pytestmark = pytest.mark.django_db(transaction=True)

STACK_TRACE = re.compile(rb"Traceback \(most recent call last\)|File \"/[^\"]+\.py\", line \d+")
CHAT = b"/v1/chat/completions"
KEY = b"{KEY}"  # replaced by a valid key of the test's tenant


def _nested(depth: int) -> bytes:
    content = b"[" * depth + b'"x"' + b"]" * depth
    return b'{"model":"trivial","messages":[{"role":"user","content":' + content + b"}]}"


def _chat(**fields: object) -> bytes:
    body = {"model": "trivial", "messages": [{"role": "user", "content": "hi"}], **fields}
    return json.dumps(body).encode()


def _big(field: str, literal: bytes) -> bytes:
    start = b'{"model":"trivial","messages":[{"role":"user","content":"hi"}],"'
    return start + field.encode() + b'":' + literal + b"}"


AUTH = [
    b"Bearer ' OR '1'='1",
    b"Bearer ' OR 1=1; --",
    b'Bearer "; DROP TABLE console_apikey; --',
    b"Bearer sk-'||(SELECT pg_sleep(5))||'",
    b"Bearer ${jndi:ldap://127.0.0.1/a}",
    b"Bearer ../../../../etc/passwd",
    b"Bearer \xff\xfe\xfd invalid utf-8",
    b"Bearer \xc3\x28",
    b"Bearer " + b"A" * 8000,
    b"Bearer",
    b"Bearer     ",
    b"bearer\ttabbed",
    b"Basic dXNlcjpwYXNz",
    b"Token abc",
    b"\xff\xff",
    b"Bearer %00%27",
]
HEADERS: list[list[tuple[bytes, bytes]]] = [
    [(b"X-Big", b"a" * 100_000)],  # one header past any sane head limit
    [(b"X-H%d" % i, b"v" * 100) for i in range(300)],  # many headers
    [(b"X-Priority", b"\xff\xfe")],
    [(b"X-Priority", b"' OR 1=1 --")],
    [(b"X-Request-Id", b"\xc3\x28" * 50)],
    [(b"Authorization", b"Bearer a"), (b"Authorization", b"Bearer b")],
    [(b"Content-Type", b"application/json\xff")],
]
CONTENT_TYPES = [
    None,
    b"text/plain",
    b"application/x-www-form-urlencoded",
    b"multipart/form-data; boundary=x",
    b"application/json; charset=latin-1",
    b"application/xml",
    b"*/*",
]
BODIES = [
    b"\xff\xfe\xfd\xfc",
    b'{"model": "\xff\xfe", "messages": []}',
    b'{"model":"trivial","messages":[{"role":"user","content":"\xc3\x28"}]}',
    b"\x00" * 64,
    b"[" * 100_000,
    _nested(1000),
    _nested(200),
    b'{"model":"trivial","messages":' + b'{"a":' * 5000 + b"1" + b"}" * 5000 + b"}",
    _big("max_tokens", b"1" + b"0" * 400),
    _big("max_tokens", b"18446744073709551615"),
    _big("max_tokens", b"9223372036854775807"),
    _big("max_tokens", b"1e308"),
    _big("temperature", b"1e999"),
    _big("temperature", b"-1e308"),
    _big("n", b"-9223372036854775808"),
    _big("top_p", b"NaN"),
    _big("seed", b"99999999999999999999999"),
    _big("logit_bias", b'{"99999999999999999999": 100}'),
    _chat(max_tokens=2**63, stream=True),
    _chat(model="trivial' OR '1'='1"),
    _chat(model="../../etc/passwd"),
    _chat(model="x" * 100_000),
    _chat(messages=[{"role": "' OR 1=1 --", "content": "hi"}]),
    _chat(messages=[{"role": "user", "content": "hi", "name": "\u0000"}]),
    _chat(messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}] * 2000}]),
    _chat(stop=["x"] * 10_000),
    b'{"model":"trivial","messages":[{"role":"user","content":"hi"}],"model":["dup"]}',
    b"null",
    b'"just a string"',
    b"",
]
PATHS = [
    (b"GET", CHAT),
    (b"PUT", CHAT),
    (b"DELETE", b"/v1/completions"),
    (b"OPTIONS", b"/v1/embeddings"),
    (b"PATCH", b"/v1/models"),
    (b"GET", b"/v1/models/%ff%fe"),
    (b"GET", b"/v1/models/' OR 1=1 --"),
    (b"GET", b"/v1/models/" + b"x" * 20_000),
    (b"GET", b"/v1/../api/users/"),
    (b"GET", b"/v1/%2e%2e/api/users/"),
    (b"GET", b"/v1/models/\xff\xfe"),
    (b"POST", b"/v1/chat/completions?model=' OR 1=1"),
    (b"FOO", b"/v1/models"),
]


def _cases() -> list[tuple[str, bytes, bytes, list[tuple[bytes, bytes]], bytes]]:
    """(label, method, path, headers, body); every header list gets Host and a close."""
    valid = (b"Authorization", b"Bearer " + KEY)
    json_ct = (b"Content-Type", b"application/json")
    cases = []
    for i, auth in enumerate(AUTH):
        cases.append((f"auth-{i}", b"POST", CHAT, [(b"Authorization", auth), json_ct], _chat()))
        cases.append((f"auth-models-{i}", b"GET", b"/v1/models", [(b"Authorization", auth)], b""))
    for i, extra in enumerate(HEADERS):
        headers = [valid, json_ct] if not any(name == b"Authorization" for name, _ in extra) else [json_ct]
        cases.append((f"headers-{i}", b"POST", CHAT, [*headers, *extra], _chat()))
    for i, ctype in enumerate(CONTENT_TYPES):
        headers = [valid] + ([(b"Content-Type", ctype)] if ctype is not None else [])
        cases.append((f"content-type-{i}", b"POST", CHAT, headers, _chat()))
    for i, body in enumerate(BODIES):
        for path in (CHAT, b"/v1/completions", b"/v1/embeddings"):
            cases.append((f"body-{i}-{path.decode()}", b"POST", path, [valid, json_ct], body))
    for i, (method, path) in enumerate(PATHS):
        cases.append((f"path-{i}", method, path, [valid, json_ct], _chat() if method == b"POST" else b""))
    # A content-length that lies, and one that is not a number.
    cases.append(("length-short", b"POST", CHAT, [valid, json_ct, (b"Content-Length", b"5")], _chat()))
    cases.append(("length-bad", b"POST", CHAT, [valid, json_ct, (b"Content-Length", b"-1")], b""))
    cases.append(("length-huge", b"POST", CHAT, [valid, json_ct, (b"Content-Length", b"9" * 30)], b""))
    return cases


CASES = _cases()


def _send(port: int, method: bytes, path: bytes, headers: list[tuple[bytes, bytes]], body: bytes) -> bytes:
    """One request as raw bytes; the whole answer (the connection closes after it), or b"" if none came."""
    has_length = any(name.lower() == b"content-length" for name, _ in headers)
    head = [method + b" " + path + b" HTTP/1.1", b"Host: 127.0.0.1", b"Connection: close"]
    head += [name + b": " + value for name, value in headers]
    if not has_length:
        head.append(b"Content-Length: %d" % len(body))
    data = b"\r\n".join(head) + b"\r\n\r\n" + body
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        # The server may answer (431/413) and close before taking everything. No half-close after the
        # request: a server may rightly take that as the client leaving.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(data)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except (ConnectionResetError, TimeoutError):
            pass
    return b"".join(chunks)


@pytest.fixture(params=["proxy", "web"])
def server(
    request: pytest.FixtureRequest, start_proxy: Callable[..., Proc], trivial_backend: Proc, tmp_path: Path
) -> Iterator[tuple[int, TenantKey, Proc]]:
    tk = make_tenant_key("hostile", scopes=["trivial"], max_output_tokens=512)
    static = f"trivial={trivial_backend.url}"
    if request.param == "proxy":
        proxy = start_proxy(static=static)
        yield proxy.port, tk, trivial_backend
        return
    console = start_console(tmp_path, {"PROXY_STATIC_ENDPOINTS": static})
    try:
        yield console.port, tk, trivial_backend
    finally:
        console.stop()


def test_hostile_requests_get_no_5xx_and_no_stack_trace(server: tuple[int, TenantKey, Proc]) -> None:
    port, tk, _backend = server
    key = tk.raw_key.encode()
    answered: dict[int, int] = {}
    failures = []
    for label, method, path, headers, body in CASES:
        headers = [(name, value.replace(KEY, key)) for name, value in headers]
        raw = _send(port, method, path, headers, body)
        status_line = raw.split(b"\r\n", 1)[0]
        match = re.match(rb"HTTP/1\.[01] (\d{3})", status_line)
        if match is None:
            failures.append(f"{label}: no HTTP answer ({raw[:100]!r})")
            continue
        status = int(match.group(1))
        answered[status] = answered.get(status, 0) + 1
        if status >= 500:
            failures.append(f"{label}: {status} {raw[-300:]!r}")
        if STACK_TRACE.search(raw):
            failures.append(f"{label}: stack trace in {raw[-500:]!r}")
        if status >= 400:
            head, _, payload = raw.partition(b"\r\n\r\n")
            if b"content-type: application/json" in head.lower():
                json.loads(payload)  # a JSON refusal is whole JSON
    assert failures == [], "\n".join(failures)
    assert sum(answered.values()) == len(CASES) >= 150
    assert set(answered) - {200, 400, 401, 403, 404, 405, 411, 413, 415, 422, 429, 431} == set(), answered


def test_a_body_nested_past_the_write_limit_is_a_400_not_a_500(
    start_proxy: Callable[..., Proc], trivial_backend: Proc
) -> None:
    """Found by the cases above: orjson reads 1024 levels but writes 254, and the proxy re-serializes
    the body for the engine, so a body 255-1024 levels deep was a 500 `internal_error`."""
    tk = make_tenant_key("deep", scopes=["trivial"])
    proxy = start_proxy(static=f"trivial={trivial_backend.url}")
    headers = [(b"Authorization", b"Bearer " + tk.raw_key.encode()), (b"Content-Type", b"application/json")]
    raw = _send(proxy.port, b"POST", CHAT, headers, _nested(300))
    assert raw.startswith(b"HTTP/1.1 400 "), raw[:200]
    error = json.loads(raw.partition(b"\r\n\r\n")[2])["error"]
    assert error["code"] == "json_too_deep" and "254 levels" in error["message"]
    # Within the limit a nested body is not refused for its depth (the engine judges its content).
    raw = _send(proxy.port, b"POST", CHAT, headers, _nested(250))
    assert b"json_too_deep" not in raw and not raw.startswith(b"HTTP/1.1 5")


def test_the_depth_check_costs_nothing_for_ordinary_bodies() -> None:
    from routing.proxy.nesting import MAX_DEPTH, check_nesting

    body = {"model": "m", "messages": [{"role": "user", "content": "[" * 10_000}]}  # brackets in a string
    check_nesting(json.dumps(body).encode(), body)  # counted, then the exact check passes
    deep: object = "x"
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(Exception, match="nested more than"):
        check_nesting(json.dumps(deep).encode(), deep)
