"""`manage.py serve_model_store` serves a directory store with Range requests, as the agents' resume needs."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import urllib3

ROOT = Path(__file__).resolve().parent.parent.parent


def test_serves_files_and_byte_ranges(tmp_path: Path) -> None:
    (tmp_path / "abc").mkdir()
    (tmp_path / "abc" / "w.bin").write_bytes(bytes(range(256)) * 4)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "serve_model_store", "--root", str(tmp_path), "--port", str(port)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        pool = urllib3.PoolManager(retries=False)
        url = f"http://127.0.0.1:{port}/store/abc/w.bin"
        deadline = time.monotonic() + 30
        while True:
            try:
                resp = pool.request("GET", url, headers={"Range": "bytes=1000-"})
                break
            except urllib3.exceptions.HTTPError:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.1)
        assert resp.status == 206
        assert resp.headers["Content-Range"] == "bytes 1000-1023/1024"
        assert resp.data == bytes(range(232, 256))
        assert pool.request("GET", url).data == bytes(range(256)) * 4
    finally:
        proc.terminate()
        proc.wait(10)
