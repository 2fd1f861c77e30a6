"""Bad input gets the right status and an OpenAI-shaped error, and never reaches an engine."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.routing.conftest import Proc, make_tenant_key, post

pytestmark = pytest.mark.django_db(transaction=True)

MSG = [{"role": "user", "content": "hi"}]
CASES: list[tuple[str, Any, bytes | None, int, str | None]] = [
    ("malformed json", None, b'{"model": "trivial", "messages": [', 400, None),
    ("not an object", None, b"[1, 2]", 400, None),
    ("missing model", {"messages": MSG}, None, 400, "model"),
    ("messages wrong type", {"model": "trivial", "messages": "hi"}, None, 400, "messages"),
    (
        "max_tokens wrong type",
        {"model": "trivial", "messages": MSG, "max_tokens": "lots"},
        None,
        400,
        "max_tokens",
    ),
    ("negative max_tokens", {"model": "trivial", "messages": MSG, "max_tokens": -5}, None, 400, "max_tokens"),
    (
        "max_tokens above cap",
        {"model": "trivial", "messages": MSG, "max_tokens": 100000},
        None,
        400,
        "max_tokens",
    ),
    (
        "absurd temperature",
        {"model": "trivial", "messages": MSG, "temperature": 1e9},
        None,
        400,
        "temperature",
    ),
    ("stream not bool", {"model": "trivial", "messages": MSG, "stream": "yes"}, None, 400, "stream"),
    ("unknown alias", {"model": "no-such-model", "messages": MSG}, None, 404, "model"),
    ("alias outside the key's scope", {"model": "other", "messages": MSG}, None, 403, "model"),
    ("body over the size limit", None, b'{"model":"trivial","x":"' + b"a" * 3000 + b'"}', 413, None),
]


@pytest.mark.parametrize(("label", "body", "raw", "status", "param"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_refused_with_openai_error(
    start_proxy: Callable[..., Proc],
    trivial_backend: Proc,
    label: str,
    body: Any,
    raw: bytes | None,
    status: int,
    param: str | None,
) -> None:
    tk = make_tenant_key(scopes=["trivial"], max_output_tokens=512)
    proxy = start_proxy(
        static=f"trivial={trivial_backend.url},other={trivial_backend.url}", PROXY_MAX_BODY_BYTES="2048"
    )
    resp = post(proxy.url + "/v1/chat/completions", tk.raw_key, body, raw=raw)
    assert resp.status == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    assert error["param"] == param


def test_prompt_over_max_input_tokens_is_400(start_proxy: Callable[..., Proc], trivial_backend: Proc) -> None:
    tk = make_tenant_key(max_input_tokens=50)
    proxy = start_proxy(static=f"trivial={trivial_backend.url}")
    long = [{"role": "user", "content": "word " * 500}]
    resp = post(proxy.url + "/v1/chat/completions", tk.raw_key, {"model": "trivial", "messages": long})
    assert resp.status == 400
    assert resp.json()["error"]["code"] == "input_tokens_exceeded"
