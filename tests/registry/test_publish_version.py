"""`manage.py publish_version` puts a version into a directory store under its manifest digest, checked."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from models_registry.models import ModelStore
from tests.registry.factories import register_dir

pytestmark = pytest.mark.django_db


def test_publish_copies_every_manifest_file_under_the_digest(model_dir: Path, tmp_path: Path) -> None:
    version = register_dir(model_dir)
    ModelStore.objects.create(name="nfs", kind="directory", location=str(tmp_path / "store"), is_active=True)

    call_command("publish_version", str(version.pk))

    target = tmp_path / "store" / version.manifest_digest
    for manifest_file in version.files.all():
        assert (target / manifest_file.path).read_bytes() == (model_dir / manifest_file.path).read_bytes()
    assert not list(target.rglob("*.publishing"))


def test_source_changed_since_registration_is_not_published(model_dir: Path, tmp_path: Path) -> None:
    version = register_dir(model_dir)
    ModelStore.objects.create(name="nfs", kind="directory", location=str(tmp_path / "store"))
    (model_dir / "config.json").write_text("{}")

    with pytest.raises(CommandError, match=r"config\.json: the source no longer matches the manifest"):
        call_command("publish_version", str(version.pk), "--store", "nfs")
    assert not (tmp_path / "store" / version.manifest_digest / "config.json").exists()
