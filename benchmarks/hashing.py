"""Hashing throughput of the model registry against `sha256sum`, and the cost of a cached re-verify.

One command:

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python benchmarks/hashing.py

What it measures, all in one run (medians of --runs repetitions, the two tools interleaved):
1. Cold-path throughput on --size-gib of random data in --files files under /tmp (page cache warm for
   both tools, so the comparison is CPU, not disk): `sha256sum` on one core against hash_files with one
   worker, then `sha256sum` run N-way in parallel (xargs -P N) against hash_files with N workers.
2. Re-verify of an unchanged tree of --tree-gib (sparse files, so the disk is not filled): a cold hash
   once to fill the cache, then hash_tree and the full verify_version_on_host (listing, stat, cache
   lookup, comparison, one VerificationRun row) on the unchanged files.

It creates a throwaway test database (like pytest does) and removes it and its files at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inferchain.settings")

import django

django.setup()

from django.conf import settings  # noqa: E402
from django.test.utils import setup_databases, teardown_databases  # noqa: E402

from models_registry.hashing import hash_files, hash_tree, list_files  # noqa: E402

MIB = 1024 * 1024
CONFIG = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
}
GIB = 1024 * MIB


def write_random_files(directory: Path, count: int, total_bytes: int) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    size = total_bytes // count
    paths = []
    for index in range(count):
        path = directory / f"model-{index + 1:05d}-of-{count:05d}.safetensors"
        with open(path, "wb") as handle:
            left = size
            while left:
                chunk = os.urandom(min(left, 64 * MIB))
                handle.write(chunk)
                left -= len(chunk)
        paths.append(path)
    return paths


def write_sparse_tree(directory: Path, count: int, total_bytes: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    size = total_bytes // count
    for index in range(count):
        # .bin, not .safetensors: a sparse file of zeros has no safetensors header to read.
        with open(directory / f"pytorch_model-{index:05d}.bin", "wb") as handle:
            handle.truncate(size)
    (directory / "config.json").write_text(json.dumps(CONFIG))


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def sha256sum(paths: list[Path], parallel: int) -> None:
    if parallel == 1:
        subprocess.run(["sha256sum", *map(str, paths)], check=True, stdout=subprocess.DEVNULL)
    else:
        subprocess.run(
            ["xargs", "-0", "-n", "1", "-P", str(parallel), "sha256sum"],
            input=b"\0".join(str(p).encode() for p in paths),
            check=True,
            stdout=subprocess.DEVNULL,
        )


def openssl_dgst(binary: str, paths: list[Path]) -> None:
    subprocess.run([binary, "dgst", "-sha256", *map(str, paths)], check=True, stdout=subprocess.DEVNULL)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-gib", type=float, default=1.0, help="random data for the throughput runs")
    parser.add_argument("--files", type=int, default=4, help="number of files the random data is split into")
    parser.add_argument("--tree-gib", type=float, default=10.0, help="size of the sparse re-verify tree")
    parser.add_argument("--tree-files", type=int, default=5, help="files in the re-verify tree")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="inferchain-hashbench-"))
    settings.MODEL_ROOTS = [work]
    settings.NODE_NAME = "bench-host"
    old_config = setup_databases(verbosity=0, interactive=False)
    try:
        run(args, work)
    finally:
        teardown_databases(old_config, verbosity=0)
        shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace, work: Path) -> None:
    from models_registry.models import Model
    from models_registry.services import register_version, verify_version_on_host

    total = int(args.size_gib * GIB)
    paths = write_random_files(work / "random", args.files, total)
    entries = list_files(work / "random").files
    # Warm the page cache so both tools read from memory.
    sha256sum(paths, 1)
    workers = args.workers

    openssl = shutil.which("openssl")
    one_sum: list[float] = []
    one_ssl: list[float] = []
    one_ours: list[float] = []
    par_sum: list[float] = []
    par_ours: list[float] = []
    for _ in range(args.runs):
        one_sum.append(timed(lambda: sha256sum(paths, 1)))
        if openssl:
            one_ssl.append(timed(lambda: openssl_dgst(openssl, paths)))
        one_ours.append(timed(lambda: hash_files(entries, use_cache=False, workers=1)))
        par_sum.append(timed(lambda: sha256sum(paths, workers)))
        par_ours.append(timed(lambda: hash_files(entries, use_cache=False, workers=workers)))

    def rate(seconds: list[float]) -> float:
        return total / statistics.median(seconds) / MIB

    base = rate(one_sum)
    print(f"# hashing: {args.size_gib:g} GiB random data in {args.files} files, medians of {args.runs} runs")
    print(f"cpu: {os.cpu_count()} cores, load average before: {os.getloadavg()[0]:.2f}; workers: {workers}")
    print()
    print("| measurement | MiB/s | per core MiB/s | per core vs sha256sum |")
    print("|---|---|---|---|")
    print(f"| sha256sum, 1 process | {base:.0f} | {base:.0f} | 1.00 |")
    if one_ssl:
        ssl = rate(one_ssl)
        print(f"| openssl dgst -sha256, 1 process (reference) | {ssl:.0f} | {ssl:.0f} | {ssl / base:.2f} |")
    ours = rate(one_ours)
    print(f"| hash_files, 1 worker | {ours:.0f} | {ours:.0f} | {ours / base:.2f} |")
    psum = rate(par_sum)
    print(
        f"| xargs -P {workers} sha256sum | {psum:.0f} | {psum / workers:.0f} | {psum / workers / base:.2f} |"
    )
    pours = rate(par_ours)
    per = pours / workers
    print(f"| hash_files, {workers} workers | {pours:.0f} | {per:.0f} | {per / base:.2f} |")
    print()

    tree_total = int(args.tree_gib * GIB)
    tree = work / "tree"
    write_sparse_tree(tree, args.tree_files, tree_total)
    # Files younger than the racy window are hashed but not cached (see hashing.RACY_WINDOW_NS).
    time.sleep(0.1)
    model = Model.objects.create(name="bench")
    cold = timed(lambda: register_version(model=model, revision="bench", source_path=str(tree)))
    from models_registry.models import ModelVersion

    version = ModelVersion.objects.get(model=model)
    warm_tree = [timed(lambda: hash_tree(tree)) for _ in range(args.runs)]
    warm_verify = [timed(lambda: verify_version_on_host(version.pk, "bench-host")) for _ in range(args.runs)]
    last = version.verifications.order_by("-id").first()
    assert last is not None and last.ok and last.bytes_hashed == 0, "re-verify should have hashed nothing"
    print(f"# re-verify of an unchanged {args.tree_gib:g} GiB tree ({args.tree_files} sparse files + config)")
    print()
    print("| step | seconds |")
    print("|---|---|")
    print(f"| first registration (hashes every byte, {workers} workers) | {cold:.2f} |")
    print(f"| hash_tree again (stat + cache lookup), median | {statistics.median(warm_tree):.4f} |")
    verify_s = statistics.median(warm_verify)
    print(f"| verify_version_on_host again (full service, writes a run row), median | {verify_s:.4f} |")


if __name__ == "__main__":
    main()
