"""Streaming, parallel sha256 of model file trees, with a per-host cache keyed by stat facts.

Why threads: hashlib releases the GIL while it digests a large buffer, so N threads hash N files on N
cores without processes or extra copies. Why a stat cache: a re-verify of an untouched 100 GB tree
must not re-read 100 GB; a file whose path, size, mtime, ctime and inode are all unchanged keeps its hash.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.utils import timezone

from models_registry.models import HashCache

# 4 MiB reads: large enough that per-call overhead vanishes and hashlib drops the GIL, small enough
# that N threads stay within a few dozen MiB.
BUFFER_SIZE = 4 * 1024 * 1024
# Extensions of files that carry weights: an extra one on a host is a failed verification, because an
# engine pointed at the directory may load it.
WEIGHT_SUFFIXES = frozenset(
    {".safetensors", ".bin", ".gguf", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".npz", ".npy"}
)
CACHE_QUERY_CHUNK = 1000
# File timestamps come from a coarse clock (one kernel tick, at most 10 ms). A file changed within a tick
# of being hashed could be rewritten later in that same tick with identical stat facts, so, like git's
# "racy" index entries, such a fresh file is hashed but not cached until it has aged past this window.
RACY_WINDOW_NS = 20_000_000


class SourcePathError(ValueError):
    """A source path that cannot be registered: missing, outside the model roots, a loop, a wrong type."""


@dataclass(frozen=True)
class FileEntry:
    """A regular file found in a tree: its manifest path and the stat facts the cache is keyed on."""

    rel_path: str
    abs_path: str
    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int


@dataclass(frozen=True)
class WalkError:
    """A path inside a tree that could not be listed or followed, with the reason."""

    rel_path: str
    message: str


@dataclass
class Listing:
    files: list[FileEntry] = field(default_factory=list)
    errors: list[WalkError] = field(default_factory=list)


@dataclass(frozen=True)
class FileHash:
    path: str
    size: int
    sha256: str
    cached: bool


@dataclass
class TreeHash:
    """The result of hashing a tree: one FileHash per readable file, plus what could not be read."""

    files: list[FileHash]
    unreadable: list[WalkError]
    bytes_hashed: int
    cache_hits: int

    @property
    def digest(self) -> str:
        return manifest_digest((f.path, f.size, f.sha256) for f in self.files)


def local_host_name() -> str:
    """The name this process uses for itself in verification runs and the hash cache."""
    return settings.NODE_NAME or socket.gethostname()


def allowed_roots() -> list[Path]:
    return [Path(root).resolve() for root in settings.MODEL_ROOTS]


def _under_allowed_root(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == root or path.is_relative_to(root) for root in roots)


def resolve_source(raw_path: str | os.PathLike[str]) -> tuple[Path, str]:
    """The real path of a model source and its kind ("directory" or "gguf"), or SourcePathError."""
    path = Path(raw_path)
    if not path.is_absolute():
        raise SourcePathError(f"{raw_path}: give an absolute path under one of the model roots.")
    try:
        real = path.resolve(strict=True)
    except RuntimeError:
        raise SourcePathError(f"{raw_path}: symlink loop.") from None
    except FileNotFoundError:
        raise SourcePathError(f"{raw_path}: no such file or directory.") from None
    except OSError as exc:
        raise SourcePathError(f"{raw_path}: {exc.strerror or exc}.") from None
    roots = allowed_roots()
    if not _under_allowed_root(real, roots):
        shown = ", ".join(str(r) for r in roots)
        raise SourcePathError(f"{raw_path}: outside the allowed model roots ({shown}).")
    if real.is_dir():
        return real, "directory"
    if real.is_file():
        if real.suffix.lower() != ".gguf":
            raise SourcePathError(f"{raw_path}: a single-file source must be a .gguf file.")
        return real, "gguf"
    raise SourcePathError(f"{raw_path}: neither a directory nor a regular file.")


def _entry(rel_path: str, abs_path: str, st: os.stat_result) -> FileEntry:
    return FileEntry(
        rel_path=rel_path,
        abs_path=abs_path,
        size=st.st_size,
        mtime_ns=st.st_mtime_ns,
        ctime_ns=st.st_ctime_ns,
        inode=st.st_ino,
    )


def list_files(root: Path) -> Listing:
    """Every regular file under `root` (or `root` itself if it is a file), sorted by manifest path.

    Hidden names (starting with ".") are skipped: download caches and VCS metadata are not weights.
    Symlinks are followed (Hugging Face snapshots are symlinks into a blob store) but must stay inside
    the model roots; a directory reached twice is a loop and is reported, not walked forever.
    """
    listing = Listing()
    roots = allowed_roots()
    try:
        root_stat = os.stat(root)
    except OSError as exc:
        listing.errors.append(WalkError(".", exc.strerror or str(exc)))
        return listing
    if not os.path.isdir(root):
        listing.files.append(_entry(root.name, str(root), root_stat))
        return listing

    visited: set[tuple[int, int]] = {(root_stat.st_dev, root_stat.st_ino)}
    stack: list[tuple[str, str]] = [(str(root), "")]
    while stack:
        dir_path, rel_dir = stack.pop()
        try:
            entries = list(os.scandir(dir_path))
        except OSError as exc:
            listing.errors.append(WalkError(rel_dir or ".", f"cannot list directory: {exc.strerror or exc}"))
            continue
        for entry in entries:
            if entry.name.startswith("."):
                continue
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            target = entry.path
            try:
                if entry.is_symlink():
                    real = Path(entry.path).resolve(strict=True)
                    if not _under_allowed_root(real, roots):
                        listing.errors.append(
                            WalkError(rel, "symlink points outside the allowed model roots")
                        )
                        continue
                    target = str(real)
                st = os.stat(target)
            except RuntimeError:
                listing.errors.append(WalkError(rel, "symlink loop"))
                continue
            except FileNotFoundError:
                listing.errors.append(WalkError(rel, "broken symlink"))
                continue
            except OSError as exc:
                listing.errors.append(WalkError(rel, exc.strerror or str(exc)))
                continue
            if os.path.isdir(target):
                key = (st.st_dev, st.st_ino)
                if key in visited:
                    listing.errors.append(WalkError(rel, "symlink loop: directory already walked"))
                    continue
                visited.add(key)
                stack.append((target, rel))
            elif os.path.isfile(target):
                listing.files.append(_entry(rel, target, st))
            # Sockets, FIFOs and devices are not model files; skip them.
    listing.files.sort(key=lambda f: f.rel_path)
    listing.errors.sort(key=lambda e: e.rel_path)
    return listing


def sha256_file(path: str) -> tuple[str, int]:
    """sha256 of a file read in BUFFER_SIZE chunks into one reused buffer; returns (hex, bytes read)."""
    digest = hashlib.sha256()
    buffer = bytearray(BUFFER_SIZE)
    view = memoryview(buffer)
    total = 0
    with open(path, "rb", buffering=0) as handle:
        if hasattr(os, "posix_fadvise"):
            # Tell the kernel to read ahead aggressively; model files are read once, front to back.
            os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        while True:
            n = handle.readinto(buffer)
            if not n:
                break
            digest.update(view[:n])
            total += n
    return digest.hexdigest(), total


def manifest_digest(entries: Iterable[tuple[str, int, str]]) -> str:
    """One sha256 over the sorted lines "<sha256> <size> <path>\\n": pins paths, sizes and contents."""
    digest = hashlib.sha256()
    for path, size, sha in sorted(entries):
        digest.update(f"{sha} {size} {path}\n".encode())
    return digest.hexdigest()


def default_workers() -> int:
    return max(1, min(16, os.cpu_count() or 1))


def _cached(host_name: str, files: Sequence[FileEntry]) -> dict[str, str]:
    """Cached sha256 by absolute path, for the files whose stat facts still match the cache row."""
    by_path = {f.abs_path: f for f in files}
    found: dict[str, str] = {}
    paths = list(by_path)
    for start in range(0, len(paths), CACHE_QUERY_CHUNK):
        rows = HashCache.objects.filter(
            host_name=host_name, path__in=paths[start : start + CACHE_QUERY_CHUNK]
        ).values_list("path", "size", "mtime_ns", "inode", "ctime_ns", "sha256")
        for path, size, mtime_ns, inode, ctime_ns, sha in rows:
            entry = by_path[path]
            if (size, mtime_ns, inode, ctime_ns) == (entry.size, entry.mtime_ns, entry.inode, entry.ctime_ns):
                found[path] = sha
    return found


def _remember(host_name: str, hashed: Sequence[tuple[FileEntry, str]]) -> None:
    now = timezone.now()
    rows = [
        HashCache(
            host_name=host_name,
            path=entry.abs_path,
            size=entry.size,
            mtime_ns=entry.mtime_ns,
            ctime_ns=entry.ctime_ns,
            inode=entry.inode,
            sha256=sha,
            hashed_at=now,
        )
        for entry, sha in hashed
    ]
    HashCache.objects.bulk_create(
        rows,
        batch_size=CACHE_QUERY_CHUNK,
        update_conflicts=True,
        unique_fields=["host_name", "path"],
        update_fields=["size", "mtime_ns", "ctime_ns", "inode", "sha256", "hashed_at"],
    )


def hash_files(
    files: Sequence[FileEntry],
    *,
    host_name: str | None = None,
    use_cache: bool = True,
    workers: int | None = None,
) -> TreeHash:
    """Hash `files` in parallel, reusing cached hashes whose stat facts are unchanged."""
    host = host_name or local_host_name()
    started_ns = time.time_ns()
    cached = _cached(host, files) if use_cache else {}
    results: dict[str, FileHash] = {}
    unreadable: list[WalkError] = []
    to_hash: list[FileEntry] = []
    for entry in files:
        sha = cached.get(entry.abs_path)
        if sha is not None:
            results[entry.rel_path] = FileHash(entry.rel_path, entry.size, sha, cached=True)
        else:
            to_hash.append(entry)

    # Largest first, so one huge shard does not start last and leave the other threads idle.
    to_hash.sort(key=lambda e: e.size, reverse=True)
    fresh: list[tuple[FileEntry, str]] = []
    bytes_hashed = 0

    def work(entry: FileEntry) -> tuple[FileEntry, str, int] | tuple[FileEntry, OSError]:
        try:
            sha, n = sha256_file(entry.abs_path)
        except OSError as exc:
            return entry, exc
        return entry, sha, n

    with ThreadPoolExecutor(max_workers=workers or default_workers()) as pool:
        for outcome in pool.map(work, to_hash):
            if len(outcome) == 2:
                entry, exc = outcome
                unreadable.append(WalkError(entry.rel_path, f"unreadable: {exc.strerror or exc}"))
                continue
            entry, sha, n = outcome
            bytes_hashed += n
            # The size actually read wins: a file that shrank while we read it must not match its manifest.
            results[entry.rel_path] = FileHash(entry.rel_path, n, sha, cached=False)
            if n == entry.size and max(entry.mtime_ns, entry.ctime_ns) < started_ns - RACY_WINDOW_NS:
                fresh.append((entry, sha))

    if use_cache and fresh:
        _remember(host, fresh)
    return TreeHash(
        files=sorted(results.values(), key=lambda f: f.path),
        unreadable=sorted(unreadable, key=lambda e: e.rel_path),
        bytes_hashed=bytes_hashed,
        cache_hits=len(files) - len(to_hash),
    )


def hash_tree(
    root: str | os.PathLike[str],
    *,
    host_name: str | None = None,
    use_cache: bool = True,
    workers: int | None = None,
) -> TreeHash:
    """List and hash every file under `root`; listing problems are returned as `unreadable`."""
    listing = list_files(Path(root))
    result = hash_files(listing.files, host_name=host_name, use_cache=use_cache, workers=workers)
    result.unreadable = sorted([*listing.errors, *result.unreadable], key=lambda e: e.rel_path)
    return result


def is_weight_file(rel_path: str) -> bool:
    return Path(rel_path).suffix.lower() in WEIGHT_SUFFIXES
