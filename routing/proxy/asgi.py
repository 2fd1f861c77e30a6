"""Standalone proxy entry: `uvicorn routing.proxy.asgi:app` serves only `/v1/` and `/metrics`."""

from __future__ import annotations

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inferchain.settings")
django.setup()

from routing.proxy.app import build_proxy_app  # noqa: E402

app = build_proxy_app()
