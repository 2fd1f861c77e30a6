"""hash_tree: streamed sha256 equal to sha256sum's, for every file of a tree, with one manifest digest."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from models_registry.hashing import BUFFER_SIZE, hash_tree, manifest_digest

pytestmark = pytest.mark.django_db


def test_hashes_match_sha256sum_for_small_empty_and_multi_buffer_files(model_root: Path) -> None:
    tree = model_root / "m"
    (tree / "sub" / "deeper").mkdir(parents=True)
    files = {
        "empty.bin": b"",
        "small.json": b'{"a": 1}',
        # Larger than two read buffers and not a multiple of one: exercises the streaming loop's tail.
        "sub/big.safetensors": os.urandom(2 * BUFFER_SIZE + 12345),
        "sub/deeper/x.txt": b"x" * 10,
    }
    for rel, data in files.items():
        (tree / rel).write_bytes(data)
    (tree / ".cache").mkdir()
    (tree / ".cache" / "ignored.lock").write_bytes(b"lock")

    result = hash_tree(tree, workers=3)

    assert [f.path for f in result.files] == sorted(files)
    out = subprocess.run(["sha256sum", *sorted(files)], cwd=tree, capture_output=True, text=True, check=True)
    expected = {line.split(None, 1)[1].strip(): line.split()[0] for line in out.stdout.splitlines()}
    for f in result.files:
        assert f.sha256 == expected[f.path]
        assert f.size == len(files[f.path])
    assert result.unreadable == []
    assert result.bytes_hashed == sum(len(d) for d in files.values())


def test_manifest_digest_pins_paths_sizes_and_hashes(model_root: Path) -> None:
    tree = model_root / "m"
    tree.mkdir()
    (tree / "a.bin").write_bytes(b"aaa")
    (tree / "b.bin").write_bytes(b"bbb")
    first = hash_tree(tree).digest
    lines = "".join(
        f"{hashlib.sha256(data).hexdigest()} 3 {name}\n"
        for name, data in (("a.bin", b"aaa"), ("b.bin", b"bbb"))
    )
    assert first == hashlib.sha256(lines.encode()).hexdigest()
    # Renaming a file changes the digest even though every content hash stays the same.
    (tree / "b.bin").rename(tree / "c.bin")
    assert hash_tree(tree).digest != first
    assert manifest_digest([("x", 1, "0" * 64)]) != manifest_digest([("x", 2, "0" * 64)])


def test_single_gguf_file_is_its_own_tree(model_root: Path) -> None:
    gguf = model_root / "one.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 100)
    result = hash_tree(gguf)
    assert [(f.path, f.size) for f in result.files] == [("one.gguf", 104)]
    assert result.files[0].sha256 == hashlib.sha256(gguf.read_bytes()).hexdigest()
