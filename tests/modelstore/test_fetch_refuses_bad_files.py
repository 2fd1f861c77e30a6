"""A corrupt, short or missing file in the store is refused with its name, and nothing half-copied stays."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodes.agent.modelstore import COMPLETE_MARKER, FileRefused, StoreConfig, fetch_version
from tests.modelstore.conftest import StoreServer, Version

BIG = "model-00001-of-00002.safetensors"


def _nothing_usable(root: Path, version: Version) -> None:
    version_dir = root / version.digest
    assert not (version_dir / COMPLETE_MARKER).exists()
    assert not (version_dir / BIG).exists()
    # The refused file's partial is gone; others stopped mid-way keep theirs (resumable, never used).
    assert not (version_dir / f"{BIG}.partial").exists()


def test_one_flipped_byte_is_refused_with_the_file_named(
    store_server: StoreServer, version: Version, tmp_path: Path
) -> None:
    stored = store_server.root / version.digest / BIG
    data = bytearray(stored.read_bytes())
    data[400_000] ^= 0x01
    stored.write_bytes(bytes(data))
    root = tmp_path / "host"

    with pytest.raises(FileRefused) as refused:
        fetch_version(
            StoreConfig(kind="http", location=store_server.url()), version.digest, version.files, root
        )

    assert refused.value.path == BIG
    assert "corrupt" in str(refused.value) and version.files[1].sha256 in str(refused.value)
    _nothing_usable(root, version)


def test_short_file_is_refused_with_both_sizes(
    store_server: StoreServer, version: Version, tmp_path: Path
) -> None:
    stored = store_server.root / version.digest / BIG
    stored.write_bytes(stored.read_bytes()[:-10])
    root = tmp_path / "host"

    with pytest.raises(
        FileRefused, match=rf"{BIG}: short file: the store has 699,990 bytes, the manifest 700,000"
    ):
        fetch_version(
            StoreConfig(kind="http", location=store_server.url()), version.digest, version.files, root
        )
    _nothing_usable(root, version)


def test_missing_file_is_refused_not_retried(
    store_server: StoreServer, version: Version, tmp_path: Path
) -> None:
    (store_server.root / version.digest / BIG).unlink()
    sleeps: list[float] = []

    with pytest.raises(FileRefused, match=rf"{BIG}: not in the store \(HTTP 404"):
        fetch_version(
            StoreConfig(kind="http", location=store_server.url()),
            version.digest,
            version.files,
            tmp_path / "host",
            sleep=sleeps.append,
        )
    assert sleeps == []
