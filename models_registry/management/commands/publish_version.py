"""`manage.py publish_version VERSION_ID [--store NAME]`: copy a version's files into a directory store."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from models_registry.models import ModelStore, ModelVersion
from models_registry.store import PublishError, active_store, publish_to_directory


class Command(BaseCommand):
    help = (
        "Copy a registered version's files from its source_path into a directory model store, under "
        "<location>/<manifest digest>/, each checked against the manifest. An HTTP store serves that "
        "same directory; an S3 bucket takes it with `aws s3 sync`."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("version_id", type=int)
        parser.add_argument("--store", default="", help="Store name (default: the active store).")

    def handle(self, *args: Any, **options: Any) -> None:
        version = ModelVersion.objects.filter(pk=options["version_id"]).first()
        if version is None:
            raise CommandError(f"No model version {options['version_id']}.")
        store = (
            ModelStore.objects.filter(name=options["store"]).first() if options["store"] else active_store()
        )
        if store is None:
            raise CommandError("No such store (and no active one): create one in the console first.")
        try:
            copied = publish_to_directory(version, store)
        except PublishError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            f"{version}: {copied:,} bytes copied to {store.location}/{version.manifest_digest}/"
        )
