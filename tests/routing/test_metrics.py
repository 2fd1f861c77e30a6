"""The proxy's /metrics exports what the Grafana dashboard in docs/ queries."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Callable
from pathlib import Path

import openai
import pytest

from tests.routing.conftest import REPO, Proc, make_tenant_key

pytestmark = pytest.mark.django_db(transaction=True)


def test_dashboard_metrics_exist(start_proxy: Callable[..., Proc], trivial_backend: Proc) -> None:
    tk = make_tenant_key(requests_per_minute=1)
    proxy = start_proxy(static=f"trivial={trivial_backend.url}")
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=tk.raw_key, max_retries=0)
    client.chat.completions.create(model="trivial", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model="trivial", messages=[{"role": "user", "content": "hi"}])
    text = urllib.request.urlopen(proxy.url + "/metrics", timeout=5).read().decode()
    # Declared families count too: a labelled counter has no samples until its first increment.
    exported = set(re.findall(r"^([a-z_:]+)(?:\{| )", text, re.MULTILINE))
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE):
        suffixes = {"counter": ["", "_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(kind, [""])
        exported.update(name + suffix for suffix in suffixes)
    dashboard = json.loads((Path(REPO) / "docs" / "grafana-dashboard.json").read_text())
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        for name in re.findall(r"inferchain_proxy_[a-z_]+", target["expr"])
    }
    assert queried and queried <= exported, queried - exported
    assert re.search(
        r'inferchain_proxy_requests_total\{alias="trivial",deployment="static-0",status="200"\} 1\.0', text
    )
    assert re.search(r'inferchain_proxy_limit_rejections_total\{reason="rate_limit_exceeded"\} 1\.0', text)
