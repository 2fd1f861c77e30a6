"""A directory store (an NFS mount, a local disk) is read the same way: verified, resumable, strict."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodes.agent.modelstore import FileRefused, StoreConfig, fetch_version
from tests.modelstore.conftest import Version, make_version

BIG = "model-00001-of-00002.safetensors"


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = tmp_path / "nfs"
    root.mkdir()
    return root


def test_directory_store_fetch_and_resume(store: Path, tmp_path: Path) -> None:
    version: Version = make_version(store, "dir", {"config.json": 200, BIG: 300_000})
    host_root = tmp_path / "host"
    partial = host_root / version.digest / f"{BIG}.partial"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(version.contents[BIG][:100_000])

    result = fetch_version(
        StoreConfig(kind="directory", location=str(store)), version.digest, version.files, host_root
    )

    for path, data in version.contents.items():
        assert (result.path / path).read_bytes() == data
    assert result.resumed == 1 and result.bytes_fetched == version.total - 100_000


def test_directory_store_refuses_a_corrupt_file(store: Path, tmp_path: Path) -> None:
    version = make_version(store, "dir", {"config.json": 200, BIG: 300_000})
    (store / version.digest / "config.json").write_bytes(b"x" * 200)

    with pytest.raises(FileRefused, match=r"config\.json: corrupt"):
        fetch_version(
            StoreConfig(kind="directory", location=str(store)), version.digest, version.files, tmp_path / "h"
        )
