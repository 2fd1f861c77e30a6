"""`manage.py demo_traffic`: the demo's background load through the proxy, until stopped (Procfile)."""

from __future__ import annotations

import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from inferchain.demo_traffic import run_demo_traffic
from nodes.demo import demo_traffic_key_file


class Command(BaseCommand):
    help = "Send demo chat requests through the proxy with the demo-traffic key that seed_demo wrote."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--rate", type=float, default=0.5, help="Requests a second per ready simulated engine."
        )
        parser.add_argument("--url", default="http://127.0.0.1:8000/v1", help="The proxy's /v1 base URL.")

    def handle(self, *args: Any, **options: Any) -> None:
        stop = threading.Event()
        # honcho stops its processes with SIGTERM, a terminal with SIGINT: either ends the loop quietly.
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        run_demo_traffic(options["rate"], stop, options["url"], demo_traffic_key_file())
