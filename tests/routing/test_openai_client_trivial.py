"""The official openai client works unchanged through the proxy: JSON and SSE, usage handled."""

from __future__ import annotations

from collections.abc import Callable

import openai
import pytest

from tests.routing.conftest import Proc, make_tenant_key

pytestmark = pytest.mark.django_db(transaction=True)


def test_chat_non_streaming_returns_usage(start_proxy: Callable[..., Proc], trivial_backend: Proc) -> None:
    tk = make_tenant_key()
    proxy = start_proxy(static=f"trivial={trivial_backend.url}")
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=tk.raw_key, max_retries=0)
    resp = client.chat.completions.create(model="trivial", messages=[{"role": "user", "content": "hi"}])
    assert resp.choices[0].message.content
    assert resp.usage is not None and resp.usage.completion_tokens > 0


def test_streaming_strips_usage_unless_asked(start_proxy: Callable[..., Proc], trivial_backend: Proc) -> None:
    tk = make_tenant_key()
    proxy = start_proxy(static=f"trivial={trivial_backend.url}")
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=tk.raw_key, max_retries=0)
    plain = list(
        client.chat.completions.create(
            model="trivial", messages=[{"role": "user", "content": "hi"}], stream=True
        )
    )
    assert plain and all(chunk.choices for chunk in plain)
    assert all(chunk.usage is None for chunk in plain)
    with_usage = list(
        client.chat.completions.create(
            model="trivial",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert with_usage[-1].usage is not None and with_usage[-1].usage.completion_tokens > 0


def test_models_lists_only_scoped_aliases(start_proxy: Callable[..., Proc], trivial_backend: Proc) -> None:
    tk = make_tenant_key(scopes=["trivial"])
    proxy = start_proxy(static=f"trivial={trivial_backend.url},other={trivial_backend.url}")
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=tk.raw_key, max_retries=0)
    assert [m.id for m in client.models.list()] == ["trivial"]
    with pytest.raises(openai.PermissionDeniedError):
        client.chat.completions.create(model="other", messages=[{"role": "user", "content": "hi"}])


def test_embeddings_are_forwarded(start_proxy: Callable[..., Proc], trivial_backend: Proc) -> None:
    tk = make_tenant_key()
    proxy = start_proxy(static=f"trivial={trivial_backend.url}")
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=tk.raw_key, max_retries=0)
    resp = client.embeddings.create(model="trivial", input="hello world")
    assert resp.data[0].embedding == [0.1, 0.2, 0.3]
    assert resp.usage.prompt_tokens == 5
