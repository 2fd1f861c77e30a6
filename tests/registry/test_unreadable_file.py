"""A file the agent cannot read is reported as unreadable, by name, not as a crash or a silent skip."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from models_registry.hashing import hash_tree

NOBODY = 65534


@pytest.fixture
def world_readable_root(settings: Any) -> Iterator[Path]:
    """A model root outside pytest's private tmp dir, so an unprivileged user can reach it."""
    root = Path(tempfile.mkdtemp(prefix="inferchain-unreadable-"))
    root.chmod(0o755)
    settings.MODEL_ROOTS = [root]
    yield root
    shutil.rmtree(root, ignore_errors=True)


def hash_as_unprivileged(tree: Path) -> dict[str, Any]:
    """hash_tree in a child process that runs as `nobody` when we are root (root reads any file)."""
    if os.geteuid() != 0:
        result = hash_tree(tree, use_cache=False)
        return {
            "files": [f.path for f in result.files],
            "unreadable": [[e.rel_path, e.message] for e in result.unreadable],
        }
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: drop privileges, hash without touching the database, report through the pipe
        status = 1
        try:
            os.close(read_end)
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            result = hash_tree(tree, use_cache=False)
            payload = {
                "files": [f.path for f in result.files],
                "unreadable": [[e.rel_path, e.message] for e in result.unreadable],
            }
            os.write(write_end, json.dumps(payload).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert status == 0, "the unprivileged child failed"
    return dict(json.loads(data))


def test_unreadable_file_is_named(world_readable_root: Path) -> None:
    tree = world_readable_root / "m"
    tree.mkdir(mode=0o755)
    (tree / "config.json").write_text("{}")
    (tree / "config.json").chmod(0o644)
    secret = tree / "model.safetensors"
    secret.write_bytes(b"weights")
    secret.chmod(0)
    result = hash_as_unprivileged(tree)
    assert result["files"] == ["config.json"]
    assert result["unreadable"] == [["model.safetensors", "unreadable: Permission denied"]]
