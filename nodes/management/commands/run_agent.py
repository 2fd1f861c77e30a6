"""`manage.py run_agent NAME`: the node agent for host NAME (Celery worker on node.NAME + supervisor)."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from nodes.agent.main import build_parser, run


class Command(BaseCommand):
    help = "Run the node agent for one host: its Celery queue, engine supervision and GPU telemetry."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="Host name.")
        for action in build_parser()._actions:
            if action.dest in ("help", "host"):
                continue
            kwargs: dict[str, Any] = {"dest": action.dest, "default": action.default, "help": action.help}
            if action.type is not None:
                kwargs["type"] = action.type
            parser.add_argument(*action.option_strings, **kwargs)

    def handle(self, *args: Any, **options: Any) -> None:
        run(argparse.Namespace(host=options["name"], **{k: v for k, v in options.items() if k != "name"}))
