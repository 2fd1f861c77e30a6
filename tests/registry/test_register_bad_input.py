"""Registration refuses bad sources with a clear message, and leaves nothing behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from models_registry.hashing import SourcePathError
from models_registry.models import ManifestFile, ModelVersion, VerificationRun
from models_registry.services import ArchitectureError, ManifestError, RegistrationError, parse_manifest
from tests.registry.factories import make_model, register_dir

pytestmark = pytest.mark.django_db


def assert_nothing_registered() -> None:
    assert ModelVersion.objects.count() == 0
    assert ManifestFile.objects.count() == 0
    assert VerificationRun.objects.count() == 0


def test_path_that_does_not_exist(model_root: Path) -> None:
    with pytest.raises(SourcePathError, match="no such file or directory"):
        register_dir(model_root / "absent")
    assert_nothing_registered()


def test_relative_path(model_root: Path) -> None:
    with pytest.raises(SourcePathError, match="absolute path"):
        register_dir(Path("models/x"))


def test_path_outside_the_model_roots(model_root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "w.safetensors").write_bytes(b"x")
    model = make_model()
    with pytest.raises(SourcePathError, match="outside the allowed model roots"):
        register_dir(outside, model=model)
    # A `..` that climbs out is caught after resolving, not by string matching.
    with pytest.raises(SourcePathError, match="outside the allowed model roots"):
        register_dir(model_root / ".." / "elsewhere", model=model)
    assert_nothing_registered()


def test_symlink_inside_tree_that_escapes_the_roots(model_dir: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"not yours")
    (model_dir / "leak.bin").symlink_to(secret)
    with pytest.raises(RegistrationError, match=r"leak\.bin:\ symlink\ points\ outside") as info:
        register_dir(model_dir)
    assert info.value.problems[0]["path"] == "leak.bin"
    assert_nothing_registered()


def test_symlink_loop(model_dir: Path) -> None:
    (model_dir / "loop").symlink_to(model_dir)
    with pytest.raises(RegistrationError, match="loop: symlink loop"):
        register_dir(model_dir)
    assert_nothing_registered()


def test_self_referencing_symlink_as_source(model_root: Path) -> None:
    link = model_root / "self"
    link.symlink_to(link)
    with pytest.raises(SourcePathError, match="symlink loop"):
        register_dir(link)


def test_broken_symlink_names_the_file(model_dir: Path) -> None:
    (model_dir / "gone.safetensors").symlink_to(model_dir / "never-there")
    with pytest.raises(RegistrationError, match=r"gone\.safetensors:\ broken\ symlink"):
        register_dir(model_dir)
    assert_nothing_registered()


def test_gguf_with_a_bad_header(model_root: Path) -> None:
    bad = model_root / "bad.gguf"
    bad.write_bytes(b"GGUX" + os.urandom(256))
    with pytest.raises(ArchitectureError, match=r"bad.gguf: not a valid GGUF file"):
        register_dir(bad)
    assert_nothing_registered()


def test_non_gguf_single_file(model_root: Path) -> None:
    (model_root / "weights.bin").write_bytes(b"x")
    with pytest.raises(SourcePathError, match=r"must\ be\ a\ \.gguf\ file"):
        register_dir(model_root / "weights.bin")


def test_malformed_config_json(model_dir: Path) -> None:
    (model_dir / "config.json").write_text("{not json")
    with pytest.raises(ArchitectureError, match=r"config\.json:\ not\ valid\ JSON"):
        register_dir(model_dir)
    assert_nothing_registered()


def test_manifest_listing_a_file_twice() -> None:
    sha = "a" * 64
    with pytest.raises(ManifestError, match=r"lists\ config\.json\ twice"):
        parse_manifest(f"{sha}  config.json\n{sha}  ./config.json\n")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("xyz  config.json", "line 1"),
        (f"{'a' * 64}  ../etc/passwd", "without '..'"),
        (f"{'a' * 64}  /abs/path", "without '..'"),
        ('{"files": [{"path": "a", "sha256": "zz"}]}', "64 hex digits"),
        ('{"files": [{"path": "a", "size": -1, "sha256": "' + "a" * 64 + '"}]}', "non-negative"),
        ("{broken", "not valid JSON"),
    ],
)
def test_bad_manifests(text: str, message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        parse_manifest(text)


def test_duplicate_revision(model_dir: Path) -> None:
    model = make_model()
    register_dir(model_dir, model=model)
    with pytest.raises(RegistrationError, match="already has a version"):
        register_dir(model_dir, model=model)
    assert ModelVersion.objects.count() == 1
