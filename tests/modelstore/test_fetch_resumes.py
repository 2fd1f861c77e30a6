"""A transfer cut mid-file continues where it stopped (HTTP Range), the hash rebuilt from partial bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodes.agent.modelstore import FileRefused, StoreConfig, fetch_version
from tests.modelstore.conftest import StoreServer, Version

BIG = "model-00001-of-00002.safetensors"


def test_connection_cut_twice_resumes_without_refetching_bytes(
    store_server: StoreServer, version: Version, tmp_path: Path
) -> None:
    store_server.cuts, store_server.cut_after = 2, 250_000
    sleeps: list[float] = []
    store = StoreConfig(kind="http", location=store_server.url("flaky"))

    result = fetch_version(
        store, version.digest, version.files, tmp_path / "host", retry_delay=0.01, sleep=sleeps.append
    )

    assert (result.path / BIG).read_bytes() == version.contents[BIG]
    # Every byte crossed the wire once: the retries asked only for what was missing.
    assert result.bytes_fetched == version.total
    big_ranges = [r for r in store_server.ranges if r][:2]
    assert big_ranges == ["bytes=250000-", "bytes=500000-"]
    assert result.resumed == 2
    assert len(sleeps) >= 2


def test_partial_file_left_by_a_dead_agent_is_continued(
    store_server: StoreServer, version: Version, tmp_path: Path
) -> None:
    root = tmp_path / "host"
    partial = root / version.digest / f"{BIG}.partial"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(version.contents[BIG][:123_456])

    result = fetch_version(
        StoreConfig(kind="http", location=store_server.url()), version.digest, version.files, root
    )

    assert (result.path / BIG).read_bytes() == version.contents[BIG]
    assert result.resumed == 1
    assert result.bytes_fetched == version.total - 123_456
    assert result.bytes_verified == version.total


def test_partial_bytes_that_differ_from_the_store_are_caught_by_the_rebuilt_hash(
    store_server: StoreServer, version: Version, tmp_path: Path
) -> None:
    root = tmp_path / "host"
    partial = root / version.digest / f"{BIG}.partial"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"\0" * 1000)

    with pytest.raises(FileRefused, match=BIG) as refused:
        fetch_version(
            StoreConfig(kind="http", location=store_server.url()), version.digest, version.files, root
        )

    assert "corrupt" in str(refused.value)
    assert not partial.exists() and not (root / version.digest / BIG).exists()


def test_a_store_that_ignores_range_is_read_from_the_start(
    store_server: StoreServer, version: Version, tmp_path: Path
) -> None:
    root = tmp_path / "host"
    partial = root / version.digest / f"{BIG}.partial"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(version.contents[BIG][:123_456])
    store = StoreConfig(kind="http", location=store_server.url("norange"))

    result = fetch_version(store, version.digest, version.files, root)

    assert (result.path / BIG).read_bytes() == version.contents[BIG]
    assert result.bytes_fetched == version.total  # the first 123,456 bytes came again
