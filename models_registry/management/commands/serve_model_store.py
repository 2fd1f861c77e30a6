"""`manage.py serve_model_store [--store NAME] [--bind 0.0.0.0] [--port 8090]`: a directory store over HTTP.

aiohttp's static file handler answers Range requests (the agents' resume) and streams files with
sendfile; point an `http` model store at `http://<this host>:<port>/store`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiohttp import web
from django.core.management.base import BaseCommand, CommandError, CommandParser

from models_registry.choices import StoreKind
from models_registry.models import ModelStore


class Command(BaseCommand):
    help = "Serve a directory model store over HTTP (with Range requests) for agents on other hosts."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--store", default="", help="A directory store's name (default: --root).")
        parser.add_argument("--root", default="", help="The directory to serve, if not a named store.")
        parser.add_argument("--bind", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8090)

    def handle(self, *args: Any, **options: Any) -> None:
        root = options["root"]
        if options["store"]:
            store = ModelStore.objects.filter(name=options["store"], kind=StoreKind.DIRECTORY).first()
            if store is None:
                raise CommandError(f"No directory store named {options['store']!r}.")
            root = store.location
        if not root or not Path(root).is_dir():
            raise CommandError("Give --store (a directory store) or --root (an existing directory).")
        app = web.Application()
        app.router.add_static("/store", root)
        self.stdout.write(f"serving {root} at http://{options['bind']}:{options['port']}/store", ending="\n")
        self.stdout.flush()
        web.run_app(app, host=options["bind"], port=options["port"], print=None, access_log=None)
