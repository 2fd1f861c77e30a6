"""POST /api/model-versions/: registration from a server path, optionally against an uploaded manifest."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from core.models import AuditEvent
from models_registry.models import ManifestFile, Model, ModelVersion

pytestmark = pytest.mark.django_db

URL = "/api/model-versions/"
SHARD = "model-00001-of-00002.safetensors"


def sha256sum_text(directory: Path) -> str:
    return "".join(
        f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(directory)}\n"
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    )


def test_register_from_path_shows_manifest_with_hashes(admin_client: APIClient, model_dir: Path) -> None:
    model = Model.objects.create(name="tiny")
    response = admin_client.post(
        URL, {"model": model.pk, "revision": "r1", "source_path": str(model_dir)}, format="json"
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["state"] == "verified"
    assert body["file_count"] == 5
    assert body["architecture"]["num_kv_heads"] == 2
    assert body["tokenizer_path"] == str(model_dir / "tokenizer.json")
    assert body["max_context"] == 2048

    files = admin_client.get(f"{URL}{body['id']}/files/").json()["results"]
    shard = next(f for f in files if f["path"] == SHARD)
    assert shard["sha256"] == hashlib.sha256((model_dir / SHARD).read_bytes()).hexdigest()
    hosts = admin_client.get(f"{URL}{body['id']}/hosts/").json()
    assert [(h["host_name"], h["ok"], h["trigger"]) for h in hosts] == [("test-host", True, "registration")]
    assert AuditEvent.objects.filter(object_type="models_registry.modelversion", action="create").count() == 1


def test_register_with_uploaded_matching_manifest(admin_client: APIClient, model_dir: Path) -> None:
    model = Model.objects.create(name="tiny")
    upload = SimpleUploadedFile("SHA256SUMS", sha256sum_text(model_dir).encode())
    response = admin_client.post(
        URL,
        {"model": model.pk, "revision": "r1", "source_path": str(model_dir), "manifest_file": upload},
        format="multipart",
    )
    assert response.status_code == 201, response.json()
    assert response.json()["file_count"] == 5


def test_uploaded_manifest_that_does_not_match_is_refused_naming_the_file(
    admin_client: APIClient, model_dir: Path
) -> None:
    model = Model.objects.create(name="tiny")
    manifest = sha256sum_text(model_dir)
    good = hashlib.sha256((model_dir / SHARD).read_bytes()).hexdigest()
    (model_dir / SHARD).write_bytes(b"swapped by hand")
    response = admin_client.post(
        URL,
        {"model": model.pk, "revision": "r1", "source_path": str(model_dir), "manifest": manifest},
        format="json",
    )
    assert response.status_code == 400
    body = response.json()
    assert SHARD in body["source_path"][0]
    assert body["problems"] == [
        {
            "path": SHARD,
            "kind": "mismatch",
            "expected": good,
            "actual": hashlib.sha256(b"swapped by hand").hexdigest(),
            "detail": "",
        }
    ]
    assert ModelVersion.objects.count() == 0
    assert ManifestFile.objects.count() == 0


def test_manifest_listing_a_file_twice_is_a_400(admin_client: APIClient, model_dir: Path) -> None:
    model = Model.objects.create(name="tiny")
    text = sha256sum_text(model_dir)
    upload = SimpleUploadedFile("SHA256SUMS", (text + text.splitlines()[0] + "\n").encode())
    response = admin_client.post(
        URL,
        {"model": model.pk, "revision": "r1", "source_path": str(model_dir), "manifest_file": upload},
        format="multipart",
    )
    assert response.status_code == 400
    assert "twice" in response.json()["manifest_file"][0]
    assert ModelVersion.objects.count() == 0


@pytest.mark.parametrize(
    ("path_suffix", "message"),
    [("absent", "no such file or directory"), ("../..", "outside the allowed model roots")],
)
def test_bad_paths_are_400_with_the_reason(
    admin_client: APIClient, model_root: Path, path_suffix: str, message: str
) -> None:
    model = Model.objects.create(name="tiny")
    response = admin_client.post(
        URL,
        {"model": model.pk, "revision": "r1", "source_path": str(model_root / path_suffix)},
        format="json",
    )
    assert response.status_code == 400
    assert message in response.json()["source_path"][0]


def test_unknown_fields_are_refused(admin_client: APIClient, model_dir: Path) -> None:
    model = Model.objects.create(name="tiny")
    response = admin_client.post(
        URL,
        {"model": model.pk, "revision": "r1", "source_path": str(model_dir), "state": "verified"},
        format="json",
    )
    assert response.status_code == 400
    assert "state" in response.json()


def test_viewer_and_evaluator_cannot_register(
    viewer_client: APIClient, evaluator_client: APIClient, model_dir: Path
) -> None:
    model = Model.objects.create(name="tiny")
    body = {"model": model.pk, "revision": "r1", "source_path": str(model_dir)}
    assert viewer_client.post(URL, body, format="json").status_code == 403
    assert evaluator_client.post(URL, body, format="json").status_code == 403
    assert ModelVersion.objects.count() == 0


def test_version_in_use_by_an_alias_cannot_be_deleted(admin_client: APIClient, model_dir: Path) -> None:
    model = Model.objects.create(name="tiny")
    created = admin_client.post(
        URL, {"model": model.pk, "revision": "r1", "source_path": str(model_dir)}, format="json"
    ).json()
    admin_client.post("/api/model-aliases/", {"name": "tiny", "active_version": created["id"]}, format="json")
    response = admin_client.delete(f"{URL}{created['id']}/")
    assert response.status_code == 400
    assert "tiny" in response.json()["non_field_errors"][0]
    assert ModelVersion.objects.filter(pk=created["id"]).exists()


def test_bad_gguf_and_symlink_loop_are_400_and_leave_nothing(
    admin_client: APIClient, model_root: Path
) -> None:
    model = Model.objects.create(name="tiny")
    (model_root / "bad.gguf").write_bytes(b"NOTGGUF" + b"\0" * 64)
    loop_dir = model_root / "looped"
    loop_dir.mkdir()
    (loop_dir / "config.json").write_text("{}")
    (loop_dir / "again").symlink_to(loop_dir)
    cases = [(model_root / "bad.gguf", "not a valid GGUF file"), (loop_dir, "again: symlink loop")]
    for path, message in cases:
        response = admin_client.post(
            URL, {"model": model.pk, "revision": "r1", "source_path": str(path)}, format="json"
        )
        assert response.status_code == 400
        assert message in response.json()["source_path"][0]
    loop_problems = response.json()["problems"]
    assert [(p["path"], p["kind"]) for p in loop_problems] == [("again", "unreadable")]
    assert ModelVersion.objects.count() == 0
    assert ManifestFile.objects.count() == 0
