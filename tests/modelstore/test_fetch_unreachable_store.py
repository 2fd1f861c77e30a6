"""A store that does not answer is retried with growing waits, then refused with the reason."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from nodes.agent.modelstore import StoreConfig, StoreUnreachable, fetch_version
from tests.modelstore.conftest import StoreServer, Version


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_connection_refused_waits_then_fails_naming_file_and_store(
    store_server: StoreServer, version: Version, tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{_closed_port()}/store"
    sleeps: list[float] = []

    with pytest.raises(StoreUnreachable) as failed:
        fetch_version(
            StoreConfig(kind="http", location=url),
            version.digest,
            version.files,
            tmp_path / "host",
            retries=3,
            retry_delay=0.5,
            sleep=sleeps.append,
            workers=1,
        )

    assert sleeps == [0.5, 1.0, 2.0]
    message = str(failed.value)
    # One worker, largest file first: the shard is the file it was waiting for.
    assert (
        "model-00001-of-00002.safetensors" in message
        and "after 3 retries" in message
        and "127.0.0.1" in message
    )
    assert not list((tmp_path / "host" / version.digest).iterdir())[1:]  # only the last-used marker


def test_directory_store_that_is_not_mounted_is_unreachable(version: Version, tmp_path: Path) -> None:
    with pytest.raises(StoreUnreachable, match="not there"):
        fetch_version(
            StoreConfig(kind="directory", location=str(tmp_path / "nfs-gone")),
            version.digest,
            version.files,
            tmp_path / "host",
            retries=1,
            sleep=lambda _: None,
        )
