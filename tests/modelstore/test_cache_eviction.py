"""The host's model root is a bounded cache: least recently used versions go first, never one in use."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nodes.agent.modelstore import LAST_USED_MARKER, CacheFull, StoreConfig, cache_entries, fetch_version
from tests.modelstore.conftest import Version, make_version


def _fetch(store: Path, version: Version, root: Path, **kw: object) -> list[str]:
    result = fetch_version(
        StoreConfig(kind="directory", location=str(store)),
        version.digest,
        version.files,
        root,
        **kw,  # type: ignore[arg-type]
    )
    return result.evicted


def _age(root: Path, version: Version, seconds_ago: float) -> None:
    marker = root / version.digest / LAST_USED_MARKER
    when = marker.stat().st_mtime - seconds_ago
    os.utime(marker, (when, when))


def test_least_recently_used_goes_first_and_in_use_is_kept(tmp_path: Path) -> None:
    store, root = tmp_path / "store", tmp_path / "host"
    a, b, c, d = (make_version(store, name, {"w.safetensors": 100_000}) for name in "abcd")
    bound = 250_000  # two versions and a half
    _fetch(store, a, root, max_bytes=bound)
    _fetch(store, b, root, max_bytes=bound)
    _age(root, a, 100)
    _age(root, b, 50)
    # Using `a` again (a cache hit) makes `b` the least recently used.
    _fetch(store, a, root, max_bytes=bound)

    assert _fetch(store, c, root, max_bytes=bound) == [b.digest]
    _age(root, a, 30)
    _age(root, c, 10)
    # `a` is older than `c`, but an engine runs on it: `c` goes instead.
    assert _fetch(store, d, root, max_bytes=bound, in_use={a.digest}) == [c.digest]
    assert {e.digest for e in cache_entries(root)} == {a.digest, d.digest}


def test_no_room_without_evicting_a_running_version_fails_with_the_reason(tmp_path: Path) -> None:
    store, root = tmp_path / "store", tmp_path / "host"
    a, b = (make_version(store, name, {"w.safetensors": 100_000}) for name in "ab")
    _fetch(store, a, root, max_bytes=150_000)

    with pytest.raises(CacheFull, match=r"NODE_MODEL_CACHE_BYTES.*in use \(" + a.digest[:12]):
        _fetch(store, b, root, max_bytes=150_000, in_use={a.digest})
    assert (root / a.digest / "w.safetensors").exists()
