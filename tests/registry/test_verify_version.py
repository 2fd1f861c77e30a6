"""verify_version_on_host: a one-byte corruption, a truncation, a missing or an extra weight file fails it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from models_registry.choices import VersionState
from models_registry.models import ModelVersion
from models_registry.services import is_verified_on_host, state_on_host, verify_version_on_host
from tests.registry.conftest import HOST
from tests.registry.factories import register_dir

pytestmark = pytest.mark.django_db

SHARD = "model-00001-of-00002.safetensors"


def test_registration_leaves_a_verified_manifest(model_dir: Path) -> None:
    version = register_dir(model_dir)
    assert version.state == VersionState.VERIFIED
    files = {f.path: f for f in version.files.all()}
    assert set(files) == {
        "README.md",
        "config.json",
        "tokenizer.json",
        SHARD,
        "model-00002-of-00002.safetensors",
    }
    assert files[SHARD].sha256 == hashlib.sha256((model_dir / SHARD).read_bytes()).hexdigest()
    assert is_verified_on_host(version, HOST)
    assert not is_verified_on_host(version, "never-seen")


def test_unchanged_files_verify_ok(model_dir: Path) -> None:
    version = register_dir(model_dir)
    run = verify_version_on_host(version.pk, "node-a")
    assert run.ok and run.problems == []
    assert run.cache_hits == 0  # node-a has no cache of its own yet
    assert is_verified_on_host(version, "node-a")


def test_one_corrupted_byte_fails_and_names_the_file(model_dir: Path) -> None:
    version = register_dir(model_dir)
    path = model_dir / SHARD
    expected = hashlib.sha256(path.read_bytes()).hexdigest()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))

    run = verify_version_on_host(version.pk, HOST)

    assert not run.ok
    assert run.problems == [
        {
            "path": SHARD,
            "kind": "mismatch",
            "expected": expected,
            "actual": hashlib.sha256(bytes(data)).hexdigest(),
            "detail": "",
        }
    ]
    version.refresh_from_db()
    assert version.state == VersionState.FAILED
    assert not is_verified_on_host(version, HOST)


def test_truncated_file_is_a_mismatch_with_sizes(model_dir: Path) -> None:
    version = register_dir(model_dir)
    path = model_dir / SHARD
    full = path.read_bytes()
    path.write_bytes(full[:-100])
    run = verify_version_on_host(version.pk, HOST)
    [problem] = run.problems
    assert problem["path"] == SHARD
    assert problem["kind"] == "mismatch"
    assert problem["actual"] == hashlib.sha256(full[:-100]).hexdigest()
    assert f"expected {len(full):,} B" in problem["detail"]


def test_missing_and_extra_weight_files_fail_but_extra_readme_does_not(model_dir: Path) -> None:
    version = register_dir(model_dir)
    (model_dir / "model-00002-of-00002.safetensors").unlink()
    (model_dir / "swapped-in.safetensors").write_bytes(b"not the real weights")
    (model_dir / "NOTES.txt").write_text("harmless")
    run = verify_version_on_host(version.pk, HOST)
    kinds = {(p["path"], p["kind"]) for p in run.problems}
    assert kinds == {
        ("model-00002-of-00002.safetensors", "missing"),
        ("swapped-in.safetensors", "extra"),
    }


def test_failure_is_per_host_and_history_is_kept(model_dir: Path) -> None:
    version = register_dir(model_dir)
    assert verify_version_on_host(version.pk, "node-a").ok
    (model_dir / SHARD).write_bytes(b"corrupt")
    assert not verify_version_on_host(version.pk, "node-b").ok
    assert is_verified_on_host(version, "node-a")
    assert not is_verified_on_host(version, "node-b")
    assert (state_on_host(version, "node-a"), state_on_host(version, "node-b")) == ("verified", "failed")
    assert state_on_host(version, "node-c") == "registered"
    history = list(version.verifications.values_list("host_name", "ok", "trigger"))
    assert ("node-a", True, "task") in history
    assert ("node-b", False, "task") in history
    assert (HOST, True, "registration") in history
    assert all(r.finished_at is not None for r in version.verifications.all())


def test_repaired_file_verifies_again(model_dir: Path) -> None:
    version = register_dir(model_dir)
    good = (model_dir / SHARD).read_bytes()
    (model_dir / SHARD).write_bytes(b"x" * len(good))
    assert not verify_version_on_host(version.pk, HOST).ok
    (model_dir / SHARD).write_bytes(good)
    assert verify_version_on_host(version.pk, HOST).ok
    assert ModelVersion.objects.get(pk=version.pk).state == VersionState.VERIFIED


def test_whole_source_gone_lists_every_file_missing(model_dir: Path) -> None:
    version = register_dir(model_dir)
    renamed = model_dir.with_name("moved-away")
    model_dir.rename(renamed)
    run = verify_version_on_host(version.pk, HOST)
    assert {p["kind"] for p in run.problems} == {"missing"}
    assert len(run.problems) == version.file_count


def test_broken_symlink_is_reported_unreadable(model_dir: Path) -> None:
    version = register_dir(model_dir)
    (model_dir / SHARD).unlink()
    (model_dir / SHARD).symlink_to(model_dir / "nowhere.safetensors")
    run = verify_version_on_host(version.pk, HOST)
    assert run.problems[0]["path"] == SHARD
    assert run.problems[0]["kind"] == "unreadable"
    assert "broken symlink" in run.problems[0]["detail"]
