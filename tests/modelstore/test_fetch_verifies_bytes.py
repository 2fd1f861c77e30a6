"""A version fetched over HTTP lands byte for byte in the host's model root, and a second launch reuses it."""

from __future__ import annotations

from pathlib import Path

from nodes.agent.modelstore import COMPLETE_MARKER, StoreConfig, fetch_version
from tests.modelstore.conftest import StoreServer, Version


def test_files_arrive_byte_exact_and_named_only_when_verified(
    store_server: StoreServer, version: Version, tmp_path: Path
) -> None:
    root = tmp_path / "host-a"
    store = StoreConfig(kind="http", location=store_server.url())

    result = fetch_version(store, version.digest, version.files, root)

    assert result.path == root / version.digest
    for path, data in version.contents.items():
        assert (result.path / path).read_bytes() == data
    assert result.files_fetched == 3 and result.bytes_fetched == version.total
    assert result.bytes_verified == version.total
    assert (result.path / COMPLETE_MARKER).exists()
    assert not list(result.path.rglob("*.partial"))

    again = fetch_version(store, version.digest, version.files, root)
    assert again.cached and again.attempts == 0 and again.bytes_fetched == 0


def test_a_file_edited_in_the_cache_is_fetched_again(
    store_server: StoreServer, version: Version, tmp_path: Path
) -> None:
    root = tmp_path / "host-a"
    store = StoreConfig(kind="http", location=store_server.url())
    fetch_version(store, version.digest, version.files, root)
    config = root / version.digest / "config.json"
    config.write_bytes(b"{}" + config.read_bytes()[2:] + b" ")

    result = fetch_version(store, version.digest, version.files, root)

    assert not result.cached and result.files_fetched == 1
    assert config.read_bytes() == version.contents["config.json"]
