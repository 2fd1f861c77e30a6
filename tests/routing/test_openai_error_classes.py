"""The official client raises its own error classes for the proxy's errors, with OpenAI's fields."""

from __future__ import annotations

from collections.abc import Callable

import openai
import pytest

from tests.routing.conftest import Proc, make_tenant_key

pytestmark = pytest.mark.django_db(transaction=True)
MSG = [{"role": "user", "content": "hi"}]


def test_error_classes(start_proxy: Callable[..., Proc], trivial_backend: Proc) -> None:
    tk = make_tenant_key(requests_per_minute=3, scopes=["trivial"])
    proxy = start_proxy(static=f"trivial={trivial_backend.url},other={trivial_backend.url}")
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=tk.raw_key, max_retries=0)

    bad_key = openai.OpenAI(base_url=proxy.url + "/v1", api_key="ick_wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as auth:
        bad_key.chat.completions.create(model="trivial", messages=MSG)  # type: ignore[arg-type]
    assert auth.value.code == "invalid_api_key" and auth.value.type == "authentication_error"

    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="nope", messages=MSG)  # type: ignore[arg-type]
    assert missing.value.param == "model"

    with pytest.raises(openai.PermissionDeniedError):
        client.chat.completions.create(model="other", messages=MSG)  # type: ignore[arg-type]

    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="trivial", messages=MSG, temperature=9)  # type: ignore[arg-type]
    assert bad.value.param == "temperature"

    for _ in range(3):
        client.chat.completions.create(model="trivial", messages=MSG)  # type: ignore[arg-type]
    with pytest.raises(openai.RateLimitError) as limited:
        client.chat.completions.create(model="trivial", messages=MSG)  # type: ignore[arg-type]
    assert limited.value.code == "rate_limit_exceeded"
    assert int(limited.value.response.headers["retry-after"]) >= 1
