"""The hash cache: reused while path, size, mtime, ctime and inode are unchanged; never across hosts."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from models_registry.hashing import RACY_WINDOW_NS, hash_tree
from models_registry.models import HashCache

pytestmark = pytest.mark.django_db


def settle() -> None:
    """Let fresh files age past the racy window, after which their hashes may be cached."""
    time.sleep(RACY_WINDOW_NS / 1e9 * 2)


def make_tree(root: Path) -> Path:
    tree = root / "m"
    tree.mkdir()
    for i in range(3):
        (tree / f"shard-{i}.safetensors").write_bytes(os.urandom(100_000))
    settle()
    return tree


def test_second_hash_of_unchanged_tree_reads_nothing(model_root: Path) -> None:
    tree = make_tree(model_root)
    first = hash_tree(tree, host_name="h1")
    assert first.cache_hits == 0
    assert first.bytes_hashed == 300_000

    second = hash_tree(tree, host_name="h1")
    assert second.cache_hits == 3
    assert second.bytes_hashed == 0
    assert [f.sha256 for f in second.files] == [f.sha256 for f in first.files]
    assert all(f.cached for f in second.files)


def test_cache_row_is_what_an_unchanged_file_reports(model_root: Path) -> None:
    """Proof the stat key alone decides: a doctored cache row is believed while the file is untouched."""
    tree = make_tree(model_root)
    hash_tree(tree, host_name="h1")
    target = str((tree / "shard-0.safetensors").resolve())
    HashCache.objects.filter(host_name="h1", path=target).update(sha256="f" * 64)
    again = {f.path: f.sha256 for f in hash_tree(tree, host_name="h1").files}
    assert again["shard-0.safetensors"] == "f" * 64


def test_edit_that_keeps_size_and_mtime_is_still_rehashed(model_root: Path) -> None:
    tree = make_tree(model_root)
    hash_tree(tree, host_name="h1")
    path = tree / "shard-1.safetensors"
    before = path.stat()
    data = bytearray(path.read_bytes())
    data[500] ^= 0xFF
    path.write_bytes(bytes(data))
    # Put the old mtime back, as `touch -r` would; ctime still moves, so the cache must miss.
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    settle()
    result = {f.path: f for f in hash_tree(tree, host_name="h1").files}
    assert result["shard-1.safetensors"].cached is False
    assert result["shard-1.safetensors"].sha256 == hashlib.sha256(bytes(data)).hexdigest()
    assert result["shard-0.safetensors"].cached is True


def test_replaced_file_new_inode_is_rehashed(model_root: Path) -> None:
    tree = make_tree(model_root)
    hash_tree(tree, host_name="h1")
    path = tree / "shard-2.safetensors"
    replacement = tree / "tmp"
    replacement.write_bytes(os.urandom(100_000))
    os.replace(replacement, path)
    settle()
    result = {f.path: f for f in hash_tree(tree, host_name="h1").files}
    assert result["shard-2.safetensors"].cached is False
    assert result["shard-2.safetensors"].sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_cache_is_per_host(model_root: Path) -> None:
    tree = make_tree(model_root)
    hash_tree(tree, host_name="h1")
    other = hash_tree(tree, host_name="h2")
    assert other.cache_hits == 0
    assert other.bytes_hashed == 300_000


def test_use_cache_false_always_reads(model_root: Path) -> None:
    tree = make_tree(model_root)
    hash_tree(tree, host_name="h1")
    assert hash_tree(tree, host_name="h1", use_cache=False).bytes_hashed == 300_000


def test_file_changed_just_now_is_not_cached_yet(model_root: Path) -> None:
    """A file younger than one timestamp tick could change again unseen: hash it, do not remember it."""
    tree = model_root / "m"
    tree.mkdir()
    (tree / "fresh.bin").write_bytes(b"written a moment ago")
    assert hash_tree(tree, host_name="h1").cache_hits == 0
    assert hash_tree(tree, host_name="h1").cache_hits == 0
    settle()
    hash_tree(tree, host_name="h1")
    assert hash_tree(tree, host_name="h1").cache_hits == 1
