"""`make run`'s web process (inferchain.asgi) serves the proxy at /v1/ next to the console."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import openai
import pytest

from tests.e2e.harness import start_console
from tests.routing.conftest import Proc, make_tenant_key

pytestmark = pytest.mark.django_db(transaction=True)


def test_console_asgi_serves_v1(trivial_backend: Proc, tmp_path: Path) -> None:
    tk = make_tenant_key()
    console = start_console(tmp_path, {"PROXY_STATIC_ENDPOINTS": f"trivial={trivial_backend.url}"})
    try:
        client = openai.OpenAI(base_url=console.url + "/v1", api_key=tk.raw_key, max_retries=0)
        reply = client.chat.completions.create(model="trivial", messages=[{"role": "user", "content": "hi"}])
        assert reply.usage is not None and reply.usage.total_tokens > 0
        stream = list(
            client.chat.completions.create(
                model="trivial", messages=[{"role": "user", "content": "hi"}], stream=True
            )
        )
        assert stream
        metrics = urllib.request.urlopen(console.url + "/v1/metrics", timeout=5).read().decode()
        assert "inferchain_proxy_requests_total" in metrics
    finally:
        console.stop()
