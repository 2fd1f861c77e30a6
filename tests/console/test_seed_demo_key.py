"""Each `make run` seeds a fresh demo key and revokes the one before: the demo tenant holds one live key."""

from __future__ import annotations

import re
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

from console.models import ApiKey
from console.services import find_api_key
from inferchain.management.commands import seed_demo

pytestmark = pytest.mark.django_db


def seed() -> str:
    out = StringIO()
    call_command("seed_demo", stdout=out)
    match = re.search(r"demo API key for tenant 'demo' \(shown once\): (\S+)", out.getvalue())
    assert match, out.getvalue()
    return match.group(1)


def test_seed_revokes_the_previous_demo_key(monkeypatch: Any) -> None:
    # The models, fleet and routing seeds are other tests' business; this one is about keys.
    monkeypatch.setattr(seed_demo.Command, "extra_seed", lambda self: None)
    first = seed()
    second = seed()
    third = seed()

    assert len({first, second, third}) == 3
    live = ApiKey.objects.filter(tenant__name="demo", revoked_at__isnull=True)
    assert list(live.values_list("name", flat=True)) == [seed_demo.DEMO_KEY_NAME]
    current = find_api_key(third)
    assert current is not None and current.revoked_at is None
    for earlier in (first, second):
        old = find_api_key(earlier)
        assert old is not None and old.revoked_at is not None
