"""Fetching a model version from the store with per-byte verification, against a plain copy of the same bytes.

One command (no database, no Redis; everything on loopback and under a temporary directory):

    .venv/bin/python benchmarks/model_fetch.py [--size-mib 256] [--files 4] [--runs 5]

Six ways to bring --size-mib of random data in --files files into an empty host model root, run in turn
inside each repetition (interleaved, so a busy neighbour slows all alike), medians of --runs:

- `copy`: shutil.copyfile from a directory store (no check at all), and the same with an fsync per file
  (what the fetch does before its rename, so a crash cannot leave a renamed file without its data);
- `fetch dir`: nodes.agent.modelstore.fetch_version from the same directory store (sha256 of every byte
  as it is written, fsync, temp name and rename), with its default 4 workers and with one;
- `http plain`: urllib3 streaming each file from an aiohttp static server (its own process) to disk;
- `fetch http`: fetch_version from that server.

`sha256 only` reads and hashes the store's files without writing: the floor of a verified fetch on one core.
Then the resume path: a file cut at half is continued (the half rehashed, the rest over HTTP `Range`).
The source files stay in the page cache, so the numbers compare CPU and memory copies, not a disk.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import urllib3

from nodes.agent.modelstore import PARTIAL_SUFFIX, StoreConfig, WantedFile, fetch_version

MIB = 1024 * 1024


def serve(root: str, port: int) -> None:
    """The store's HTTP side: aiohttp's static handler (Range-capable), as a separate process."""
    from aiohttp import web  # only the server process needs it

    app = web.Application()
    app.router.add_static("/store", root)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_version(store: Path, files: int, total: int) -> tuple[str, list[WantedFile]]:
    size = total // files
    wanted = []
    staging = store / "staging"
    staging.mkdir(parents=True)
    for i in range(files):
        data = os.urandom(size)
        path = f"model-{i + 1:05d}-of-{files:05d}.safetensors"
        (staging / path).write_bytes(data)
        wanted.append(WantedFile(path, size, hashlib.sha256(data).hexdigest()))
    lines = "".join(f"{f.sha256} {f.size} {f.path}\n" for f in sorted(wanted, key=lambda f: f.path))
    digest = hashlib.sha256(lines.encode()).hexdigest()
    staging.rename(store / digest)
    return digest, wanted


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--serve", nargs=2, metavar=("ROOT", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve[0], int(args.serve[1]))
        return

    work = Path(tempfile.mkdtemp(prefix="model-fetch-bench-"))
    port = free_port()
    server = None
    try:
        store = work / "store"
        digest, wanted = make_version(store, args.files, args.size_mib * MIB)
        total = sum(f.size for f in wanted)
        server = subprocess.Popen([sys.executable, __file__, "--serve", str(store), str(port)])
        base = f"http://127.0.0.1:{port}/store"
        pool = urllib3.PoolManager(retries=False)
        deadline = time.monotonic() + 20
        while True:
            try:
                pool.request("GET", f"{base}/{digest}/{wanted[0].path}", headers={"Range": "bytes=0-0"})
                break
            except urllib3.exceptions.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

        def target(name: str) -> Path:
            root = work / "hosts" / name
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir(parents=True)
            return root

        def copy() -> None:
            dest = target("copy") / digest
            dest.mkdir()
            for f in wanted:
                shutil.copyfile(store / digest / f.path, dest / f.path)

        def copy_fsync() -> None:
            dest = target("copy-fsync") / digest
            dest.mkdir()
            for f in wanted:
                shutil.copyfile(store / digest / f.path, dest / f.path)
                with open(dest / f.path, "rb+") as out:
                    os.fsync(out.fileno())

        def fetch_dir() -> None:
            fetch_version(StoreConfig("directory", str(store)), digest, wanted, target("fetch-dir"))

        def fetch_dir_serial() -> None:
            fetch_version(
                StoreConfig("directory", str(store)), digest, wanted, target("fetch-dir-1"), workers=1
            )

        def http_plain() -> None:
            dest = target("http") / digest
            dest.mkdir()
            for f in wanted:
                resp = pool.request("GET", f"{base}/{digest}/{f.path}", preload_content=False)
                with open(dest / f.path, "wb") as out:
                    while block := resp.read1(MIB):
                        out.write(block)
                resp.release_conn()

        def fetch_http() -> None:
            fetch_version(StoreConfig("http", base), digest, wanted, target("fetch-http"))

        def resume_half() -> None:
            root = target("resume")
            first = wanted[0]
            partial = root / digest / (first.path + PARTIAL_SUFFIX)
            partial.parent.mkdir(parents=True)
            with open(store / digest / first.path, "rb") as src:
                partial.write_bytes(src.read(first.size // 2))
            result = fetch_version(StoreConfig("http", base), digest, [first], root)
            assert result.resumed == 1 and result.bytes_fetched == first.size - first.size // 2

        def sha_only() -> None:
            for f in wanted:
                digest_ = hashlib.sha256()
                with open(store / digest / f.path, "rb") as src:
                    while block := src.read(4 * MIB):
                        digest_.update(block)

        cases: dict[str, Callable[[], None]] = {
            "sha256 only (read + hash, no write)": sha_only,
            "copy (directory store, no check)": copy,
            "copy + fsync (no check)": copy_fsync,
            "fetch dir (directory store, verified)": fetch_dir,
            "fetch dir, one file at a time": fetch_dir_serial,
            "http plain (urllib3 to disk, no check)": http_plain,
            "fetch http (HTTP store, verified)": fetch_http,
        }
        times: dict[str, list[float]] = {name: [] for name in cases}
        resume: list[float] = []
        for fn in cases.values():
            fn()  # warm-up: page cache, connection pool
        for _ in range(args.runs):
            for name, fn in cases.items():
                times[name].append(timed(fn))
            resume.append(timed(resume_half))

        print(
            f"{args.size_mib} MiB in {args.files} files, {args.runs} interleaved runs, medians; "
            f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs"
        )
        print(f"{'case':42} {'seconds':>8} {'MiB/s':>8}")
        for name, values in times.items():
            median = statistics.median(values)
            print(f"{name:42} {median:8.3f} {total / MIB / median:8.0f}")
        med = {name: statistics.median(v) for name, v in times.items()}
        names = list(cases)
        print(f"fetch dir / copy:         {med[names[3]] / med[names[1]]:.2f}x the time")
        print(f"fetch dir / copy + fsync: {med[names[3]] / med[names[2]]:.2f}x the time")
        print(f"fetch dir / sha256 only:  {med[names[3]] / med[names[0]]:.2f}x the time")
        print(f"fetch dir 4 / 1 workers:  {med[names[3]] / med[names[4]]:.2f}x the time")
        print(f"fetch http / http plain:  {med[names[6]] / med[names[5]]:.2f}x the time")
        half = wanted[0].size / MIB
        print(
            f"resume of a half-fetched {half:.0f} MiB file (rehash {half / 2:.0f} MiB + fetch the rest): "
            f"{statistics.median(resume):.3f} s"
        )
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    main()
