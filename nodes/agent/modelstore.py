"""A version's files fetched from the model store into this host's own model root, verified as they arrive.

Layout on both sides: `<root>/<manifest_digest>/<manifest path>`. The store's root is a directory, a base
URL or an S3 bucket/prefix; the host's root is its own `NODE_MODEL_ROOT`, so no absolute path is shared
between hosts.

- Every byte is hashed as it is written (sha256 per file, streamed); a file becomes visible under its
  real name only after its size and hash matched the manifest (`<name>.partial`, then an atomic rename).
- A fetch cut short keeps its `.partial`; the next attempt rehashes those bytes to rebuild the hash
  state and asks only for the rest (HTTP `Range`, S3 `Range`, a seek in a directory store).
- A corrupt, short or overlong file is refused with its name and deleted; a store that cannot be
  reached is retried with backoff, then refused with the reason.
- The model root is a cache: entries are evicted least recently used first when a fetch needs room
  beyond `max_bytes`, never one a running engine uses (`in_use`) or one being fetched.

Nothing here touches the database: the caller passes the store, the manifest and the in-use set.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Protocol
from urllib.parse import quote

import urllib3

log = logging.getLogger(__name__)

CHUNK_SIZE = 1024 * 1024
# Hidden names: registration skips them when it lists a tree (models_registry/hashing.py), so an
# engine's directory walk and a re-verify never see them either.
COMPLETE_MARKER = ".inferchain-complete"
LAST_USED_MARKER = ".inferchain-last-used"
PARTIAL_SUFFIX = ".partial"
DIGEST_NAME = re.compile(r"^[0-9a-f]{64}$")


class FetchError(Exception):
    """The version's files could not be put in place; the message says which file and why."""


class StoreUnreachable(FetchError):
    """The store did not answer (connection refused, timeout, cut) after every retry."""


class FileRefused(FetchError):
    """A file the store has does not match the manifest (hash, size), or the store lacks it."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path


class CacheFull(FetchError):
    """The model root cannot make room for the version without evicting one that is in use."""


class Transient(Exception):
    """A store failure worth retrying: the connection, not the content."""


class _Cancelled(Exception):
    """Another file of the same version was refused: this one stops, keeping its .partial."""


@dataclass(frozen=True)
class StoreConfig:
    """The active store as the control plane describes it (ModelStore)."""

    kind: str  # directory | http | s3
    location: str
    name: str = ""
    endpoint_url: str = ""
    region: str = ""


@dataclass(frozen=True)
class WantedFile:
    """One manifest line: where the file goes, how big it is and its sha256."""

    path: str
    size: int
    sha256: str


@dataclass
class Opened:
    """An open read of one stored file: the offset it starts at, its byte count if known, its chunks."""

    start: int
    length: int | None
    chunks: Iterator[bytes]
    # Frees the read (socket, file handle) whether or not the chunks were read to the end.
    release: Callable[[], None] = lambda: None


class Source(Protocol):
    def open(self, key: str, offset: int) -> Opened:
        """Read `key` from `offset` (a source that cannot seek may start at 0; `start` says so).

        Raises Transient for connection trouble, FileRefused for content the store does not have.
        """
        ...


@dataclass
class FetchResult:
    path: Path  # the version's directory in the model root
    files_fetched: int = 0
    bytes_fetched: int = 0  # bytes received from the store this time (a resumed file counts its rest)
    bytes_verified: int = 0  # bytes hashed, partial bytes rehashed included
    resumed: int = 0  # files continued from a .partial
    attempts: int = 0  # store reads, retries included
    cached: bool = False  # everything was already in the model root
    evicted: list[str] = field(default_factory=list)


# Stores --------------------------------------------------------------------------------------------


class DirectorySource:
    """A store that is a directory this host can read (NFS, a local disk)."""

    def __init__(self, root: str) -> None:
        self.root = Path(root)

    def open(self, key: str, offset: int) -> Opened:
        if not self.root.is_dir():
            raise Transient(f"store directory {self.root} is not there (not mounted?)")
        path = self.root / key
        try:
            handle = open(path, "rb")  # noqa: SIM115 - closed by the generator below
        except FileNotFoundError:
            raise FileRefused(_file_of(key), f"not in the store ({path})") from None
        except OSError as exc:
            raise Transient(f"{path}: {exc.strerror or exc}") from None
        size = os.fstat(handle.fileno()).st_size
        handle.seek(min(offset, size))
        start = min(offset, size)

        def chunks() -> Iterator[bytes]:
            while block := handle.read(CHUNK_SIZE):
                yield block

        return Opened(start=start, length=size - start, chunks=chunks(), release=handle.close)


class HttpSource:
    """A store behind any HTTP server that answers Range requests (`<base>/<digest>/<path>`)."""

    def __init__(self, base_url: str, *, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        # Retries are ours (with resume), not urllib3's: it would restart a file from its first byte.
        self.pool = urllib3.PoolManager(
            retries=False, timeout=urllib3.Timeout(connect=timeout, read=timeout), maxsize=8
        )

    def open(self, key: str, offset: int) -> Opened:
        url = f"{self.base_url}/{quote(key)}"
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        try:
            resp = self.pool.request("GET", url, headers=headers, preload_content=False)
        except urllib3.exceptions.HTTPError as exc:
            raise Transient(f"{url}: {exc}") from None
        status = resp.status
        if status in (200, 206):
            start = 0
            if status == 206:
                match = re.match(r"bytes (\d+)-", resp.headers.get("Content-Range", ""))
                start = int(match.group(1)) if match else 0
            raw_length = resp.headers.get("Content-Length")
            length = int(raw_length) if raw_length and raw_length.isdigit() else None
            return Opened(
                start=start,
                length=length,
                chunks=self._chunks(resp, url),
                release=lambda: self._release(resp),
            )
        # An error page is small: read it, so the pooled connection is clean for the next file.
        resp.drain_conn()
        resp.release_conn()
        if status == 416:
            raise FileRefused(_file_of(key), f"short file: the store has fewer than {offset} bytes ({url})")
        if status in (404, 410):
            raise FileRefused(_file_of(key), f"not in the store (HTTP {status} from {url})")
        if status >= 500 or status in (408, 429):
            raise Transient(f"{url}: HTTP {status}")
        raise FileRefused(_file_of(key), f"the store answered HTTP {status} ({url})")

    def close(self) -> None:
        self.pool.clear()

    @staticmethod
    def _chunks(resp: Any, url: str) -> Iterator[bytes]:
        try:
            # read1, not stream/read: read(n) keeps what it buffered when the connection drops before n
            # bytes arrived, and those bytes would be lost to the .partial. urllib3 2 raises
            # ProtocolError when the body ends before its Content-Length.
            while block := resp.read1(CHUNK_SIZE):
                yield block
        except urllib3.exceptions.HTTPError as exc:
            raise Transient(f"{url}: connection lost mid-file ({exc})") from None

    @staticmethod
    def _release(resp: Any) -> None:
        if not resp.isclosed():
            # Left mid-body (refused, cancelled): unread bytes would poison the pooled connection.
            resp.close()
        resp.release_conn()


class S3Source:
    """An S3-compatible bucket through boto3 (optional extra `s3`); credentials from boto3's usual chain."""

    def __init__(self, location: str, *, endpoint_url: str = "", region: str = "") -> None:
        try:
            import boto3  # optional extra: only S3 hosts need it
            import botocore.exceptions
        except ImportError:
            raise FetchError(
                "this store is an S3 bucket but boto3 is not installed on this host: "
                "pip install 'inferchain[s3]'"
            ) from None
        bucket, _, prefix = location.partition("/")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.errors = botocore.exceptions
        self.client = boto3.client("s3", endpoint_url=endpoint_url or None, region_name=region or None)

    def open(self, key: str, offset: int) -> Opened:
        full = f"{self.prefix}/{key}" if self.prefix else key
        try:
            obj = self.client.get_object(Bucket=self.bucket, Key=full, Range=f"bytes={offset}-")
        except self.errors.ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "404"):
                raise FileRefused(_file_of(key), f"not in the bucket (s3://{self.bucket}/{full})") from None
            if code == "InvalidRange":
                raise FileRefused(
                    _file_of(key), f"short file: the bucket has fewer than {offset} bytes"
                ) from None
            raise Transient(f"s3://{self.bucket}/{full}: {code or exc}") from None
        except self.errors.BotoCoreError as exc:
            raise Transient(f"s3://{self.bucket}/{full}: {exc}") from None
        match = re.match(r"bytes (\d+)-", obj.get("ContentRange", ""))
        start = int(match.group(1)) if match else 0
        body = obj["Body"]

        def chunks() -> Iterator[bytes]:
            try:
                yield from body.iter_chunks(CHUNK_SIZE)
            except self.errors.BotoCoreError as exc:
                raise Transient(f"s3://{self.bucket}/{full}: {exc}") from None

        return Opened(start=start, length=obj.get("ContentLength"), chunks=chunks(), release=body.close)


def source_for(store: StoreConfig) -> Source:
    if store.kind == "directory":
        return DirectorySource(store.location)
    if store.kind == "http":
        return HttpSource(store.location)
    if store.kind == "s3":
        return S3Source(store.location, endpoint_url=store.endpoint_url, region=store.region)
    raise FetchError(f"unknown model store kind {store.kind!r}")


def _file_of(key: str) -> str:
    """The manifest path of a store key (`<digest>/<path>`)."""
    return key.split("/", 1)[1] if "/" in key else key


# One file -------------------------------------------------------------------------------------------


def _rehash(path: Path, digest: Any) -> int:
    """Feed a partial file's bytes into `digest` (sha256 state cannot be saved, so it is rebuilt)."""
    total = 0
    with open(path, "rb") as handle:
        while block := handle.read(4 * CHUNK_SIZE):
            digest.update(block)
            total += len(block)
    return total


def fetch_file(
    source: Source,
    key: str,
    dest: Path,
    want: WantedFile,
    result: FetchResult,
    stop: threading.Event | None = None,
) -> None:
    """Bring one file to `dest`, verified; resume from `dest.partial` when there is one.

    Raises Transient (the `.partial` keeps what arrived) or FileRefused (the `.partial` is deleted).
    """
    partial = dest.with_name(dest.name + PARTIAL_SUFFIX)
    dest.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    have = 0
    if partial.exists():
        if partial.stat().st_size > want.size:
            partial.unlink()
        else:
            have = _rehash(partial, digest)
            result.bytes_verified += have
            if have:
                result.resumed += 1
    if have < want.size:
        result.attempts += 1
        opened = source.open(key, have)
        try:
            have, digest = _receive(opened, partial, want, digest, have, result, stop)
        finally:
            opened.release()
        if have < want.size:
            _refuse(partial, want.path, f"short file: the store sent {have:,} of {want.size:,} bytes")
    actual = digest.hexdigest()
    if actual != want.sha256:
        _refuse(partial, want.path, f"corrupt: sha256 {actual} does not match the manifest's {want.sha256}")
    os.replace(partial, dest)
    result.files_fetched += 1


def _receive(
    opened: Opened,
    partial: Path,
    want: WantedFile,
    digest: Any,
    have: int,
    result: FetchResult,
    stop: threading.Event | None,
) -> tuple[int, Any]:
    """Append the store's bytes to the partial file, hashing each as it is written.

    Returns the partial's new length and the hash state over all of it.
    """
    if opened.start != have:
        if opened.start != 0:
            raise Transient(f"{want.path}: asked for bytes from {have}, the store sent from {opened.start}")
        # The store ignored the range: start the file over.
        digest, have = hashlib.sha256(), 0
        partial.unlink(missing_ok=True)
    if opened.length is not None and opened.start + opened.length != want.size:
        stored = opened.start + opened.length
        _refuse(
            partial,
            want.path,
            f"{'short' if stored < want.size else 'oversized'} file: the store has {stored:,} bytes, "
            f"the manifest {want.size:,}",
        )
    with open(partial, "ab") as out:
        for block in opened.chunks:
            if stop is not None and stop.is_set():
                raise _Cancelled
            if have + len(block) > want.size:
                out.close()
                _refuse(partial, want.path, f"oversized file: more than the manifest's {want.size:,} bytes")
            out.write(block)
            digest.update(block)
            have += len(block)
            result.bytes_fetched += len(block)
            result.bytes_verified += len(block)
        out.flush()
        os.fsync(out.fileno())
    return have, digest


def _refuse(partial: Path, path: str, reason: str) -> None:
    partial.unlink(missing_ok=True)
    raise FileRefused(path, reason)


# The cache ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CacheEntry:
    digest: str
    path: Path
    size: int
    last_used: float
    complete: bool


def _tree_bytes(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total


def cache_entries(root: Path) -> list[CacheEntry]:
    """Every version directory in the model root, least recently used first."""
    entries: list[CacheEntry] = []
    if not root.is_dir():
        return entries
    for child in root.iterdir():
        if not (child.is_dir() and DIGEST_NAME.match(child.name)):
            continue
        used = child / LAST_USED_MARKER
        last_used = used.stat().st_mtime if used.exists() else child.stat().st_mtime
        complete = (child / COMPLETE_MARKER).exists()
        entries.append(CacheEntry(child.name, child, _tree_bytes(child), last_used, complete))
    entries.sort(key=lambda e: (e.last_used, e.digest))
    return entries


def make_room(root: Path, digest: str, need: int, max_bytes: int, in_use: set[str]) -> list[str]:
    """Evict least recently used versions until `need` more bytes fit under `max_bytes` (0: no bound).

    Never evicts `digest` itself, a version in `in_use` (a running engine's) or one being fetched.
    """
    if max_bytes <= 0:
        return []
    entries = cache_entries(root)
    total = sum(e.size for e in entries)
    evicted: list[str] = []
    with _fetching_guard:
        busy = set(_fetching)
    keep = in_use | busy | {digest}
    for entry in entries:
        if total + need <= max_bytes:
            break
        if entry.digest in keep:
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        total -= entry.size
        evicted.append(entry.digest)
        log.info("evicted model version %s (%s bytes) from %s", entry.digest, entry.size, root)
    if total + need > max_bytes:
        held = sorted(e.digest[:12] for e in entries if e.digest in keep and e.digest != digest)
        raise CacheFull(
            f"the model root {root} holds {total:,} bytes and needs {need:,} more, over its bound of "
            f"{max_bytes:,} (NODE_MODEL_CACHE_BYTES); what is left is in use"
            + (f" ({', '.join(held)})" if held else "")
            + ": stop a deployment on this host or raise the bound."
        )
    return evicted


def touch_last_used(version_dir: Path) -> None:
    (version_dir / LAST_USED_MARKER).touch()


# A version ------------------------------------------------------------------------------------------

_fetching: set[str] = set()
_fetching_guard = threading.Lock()
_version_locks: dict[str, threading.Lock] = {}


def _version_lock(digest: str) -> threading.Lock:
    with _fetching_guard:
        return _version_locks.setdefault(digest, threading.Lock())


def _safe_path(rel: str) -> str:
    parts = PurePosixPath(rel).parts
    if not parts or PurePosixPath(rel).is_absolute() or ".." in parts:
        raise FileRefused(rel, "the manifest path is not a plain relative path")
    return str(PurePosixPath(*parts))


def _complete_and_unchanged(version_dir: Path, files: Sequence[WantedFile]) -> bool:
    """The marker says every file was verified on arrival, and none changed size or mtime since."""
    try:
        marker = json.loads((version_dir / COMPLETE_MARKER).read_text())
    except (OSError, ValueError):
        return False
    stats = marker.get("files", {}) if isinstance(marker, dict) else {}
    for want in files:
        seen = stats.get(want.path)
        try:
            st = os.stat(version_dir / want.path)
        except OSError:
            return False
        if not seen or [st.st_size, st.st_mtime_ns] != seen or st.st_size != want.size:
            return False
    return True


def fetch_version(
    store: StoreConfig | Source,
    digest: str,
    files: Sequence[WantedFile],
    model_root: Path,
    *,
    max_bytes: int = 0,
    in_use: set[str] | frozenset[str] = frozenset(),
    retries: int = 5,
    retry_delay: float = 1.0,
    sleep: Callable[[float], None] | None = None,
    workers: int = 4,
) -> FetchResult:
    """Make `<model_root>/<digest>/` hold exactly the manifest's files, verified; return where.

    Up to `workers` files travel at once (one sha256 is sequential, so one file is one core at best).
    A store that fails `retries` times in a row without sending a byte is StoreUnreachable (waits of
    retry_delay, doubling, at most 30 s). Any refused file stops the fetch with its name; the other
    files stop at their next chunk and keep their `.partial` for the next attempt.
    """
    if not DIGEST_NAME.match(digest):
        raise FetchError(f"{digest!r} is not a manifest digest")
    wanted = [WantedFile(_safe_path(f.path), f.size, f.sha256) for f in files]
    source = source_for(store) if isinstance(store, StoreConfig) else store
    version_dir = model_root / digest
    with _version_lock(digest):
        with _fetching_guard:
            _fetching.add(digest)
        try:
            result = FetchResult(path=version_dir)
            if _complete_and_unchanged(version_dir, wanted):
                touch_last_used(version_dir)
                result.cached = True
                return result
            (version_dir / COMPLETE_MARKER).unlink(missing_ok=True)
            need = sum(f.size for f in wanted) - (_tree_bytes(version_dir) if version_dir.exists() else 0)
            model_root.mkdir(parents=True, exist_ok=True)
            result.evicted = make_room(model_root, digest, max(need, 0), max_bytes, set(in_use))
            version_dir.mkdir(parents=True, exist_ok=True)
            touch_last_used(version_dir)
            _fetch_all(source, digest, version_dir, wanted, result, retries, retry_delay, sleep, workers)
            _write_marker(version_dir, wanted)
            return result
        finally:
            with _fetching_guard:
                _fetching.discard(digest)
            if isinstance(store, StoreConfig) and isinstance(source, HttpSource):
                source.close()


def _fetch_all(
    source: Source,
    digest: str,
    version_dir: Path,
    wanted: Sequence[WantedFile],
    result: FetchResult,
    retries: int,
    retry_delay: float,
    sleep: Callable[[float], None] | None,
    workers: int,
) -> None:
    stop = threading.Event()

    def one(want: WantedFile) -> FetchResult:
        part = FetchResult(path=version_dir)
        try:
            _fetch_with_retries(source, digest, version_dir, want, part, retries, retry_delay, sleep, stop)
        except _Cancelled:
            raise
        except BaseException:
            stop.set()  # here, not when the caller sees it: the next file may start before that
            raise
        return part

    first_error: BaseException | None = None
    # Largest first, so one big shard does not start last while the other workers sit idle.
    order = sorted(wanted, key=lambda f: f.size, reverse=True)
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(order)))) as pool:
        for future in as_completed([pool.submit(one, want) for want in order]):
            try:
                part = future.result()
            except _Cancelled:
                continue
            except BaseException as exc:
                first_error = first_error or exc
                continue
            result.files_fetched += part.files_fetched
            result.bytes_fetched += part.bytes_fetched
            result.bytes_verified += part.bytes_verified
            result.resumed += part.resumed
            result.attempts += part.attempts
    if first_error is not None:
        raise first_error


def _fetch_with_retries(
    source: Source,
    digest: str,
    version_dir: Path,
    want: WantedFile,
    result: FetchResult,
    retries: int,
    retry_delay: float,
    sleep: Callable[[float], None] | None,
    stop: threading.Event,
) -> None:
    dest = version_dir / want.path
    if dest.exists() and dest.stat().st_size == want.size and _sha256(dest) == want.sha256:
        # Already verified and renamed by an earlier, interrupted fetch of this version.
        result.bytes_verified += want.size
        return
    failures = 0
    delay = retry_delay
    while True:
        before = result.bytes_fetched
        if stop.is_set():
            raise _Cancelled
        try:
            fetch_file(source, f"{digest}/{want.path}", dest, want, result, stop)
            return
        except Transient as exc:
            failures = 0 if result.bytes_fetched > before else failures + 1
            if failures > retries:
                raise StoreUnreachable(
                    f"{want.path}: the model store did not answer after {retries} retries ({exc})"
                ) from None
            log.warning("model store: %s; retrying in %.1f s", exc, delay)
            if sleep is not None:
                sleep(delay)
            elif stop.wait(delay):
                raise _Cancelled from None
            delay = min(delay * 2, 30.0)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    _rehash(path, digest)
    return digest.hexdigest()


def _write_marker(version_dir: Path, wanted: Sequence[WantedFile]) -> None:
    stats = {}
    for want in wanted:
        st = os.stat(version_dir / want.path)
        stats[want.path] = [st.st_size, st.st_mtime_ns]
    tmp = version_dir / (COMPLETE_MARKER + PARTIAL_SUFFIX)
    tmp.write_text(json.dumps({"files": stats}))
    os.replace(tmp, version_dir / COMPLETE_MARKER)
