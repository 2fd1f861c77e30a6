"""The model store: where agents fetch versions from, how a version gets into it, and what a fetch leaves.

A version's files sit in the store under `<location>/<manifest_digest>/<manifest path>`. The agent's side
(fetch, verify, resume, cache) is nodes/agent/modelstore.py; this module is the control plane's side.
"""

from __future__ import annotations

import hashlib
import os
from datetime import datetime
from pathlib import Path
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from models_registry.choices import SourceKind, StoreKind
from models_registry.hashing import BUFFER_SIZE
from models_registry.models import ModelStore, ModelVersion, VerificationRun
from models_registry.services import refresh_version_state


class PublishError(ValueError):
    """A version could not be copied into the store; the message names the file."""


def active_store() -> ModelStore | None:
    """The store agents fetch from, or None (then every host reads the version's source_path)."""
    return ModelStore.objects.filter(is_active=True).first()


def manifest_of(version: ModelVersion) -> list[tuple[str, int, str]]:
    """(path, size, sha256) of every manifest file, in path order."""
    return list(version.files.order_by("path").values_list("path", "size", "sha256"))


def local_model_path(version: ModelVersion, version_dir: Path) -> Path:
    """What the engine loads from a fetched version: its directory, or the one file of a GGUF version."""
    if version.source_kind == SourceKind.GGUF:
        paths = [path for path, _, _ in manifest_of(version)]
        return version_dir / paths[0]
    return version_dir


def source_file(version: ModelVersion, path: str) -> Path:
    root = Path(version.source_path)
    return root if version.source_kind == SourceKind.GGUF else root / path


def publish_to_directory(version: ModelVersion, store: ModelStore) -> int:
    """Copy a version's files from its source_path into a directory store, each checked on the way.

    Written under a temporary name and renamed, so an agent never reads a half-copied file; a file
    already there with the right size and hash is kept. Returns the bytes copied.
    """
    if store.kind != StoreKind.DIRECTORY:
        raise PublishError(f"{store.name} is a {store.kind} store; only directory stores are written here.")
    target = Path(store.location) / version.manifest_digest
    copied = 0
    for path, size, sha in manifest_of(version):
        dest = target / path
        if dest.exists() and dest.stat().st_size == size and _sha256(dest) == sha:
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".publishing")
        digest = hashlib.sha256()
        try:
            with open(source_file(version, path), "rb") as src, open(tmp, "wb") as out:
                while block := src.read(BUFFER_SIZE):
                    digest.update(block)
                    out.write(block)
                    copied += len(block)
                out.flush()
                os.fsync(out.fileno())
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise PublishError(f"{path}: {exc.strerror or exc}") from None
        if tmp.stat().st_size != size or digest.hexdigest() != sha:
            tmp.unlink(missing_ok=True)
            raise PublishError(f"{path}: the source no longer matches the manifest; re-verify the version.")
        os.replace(tmp, dest)
    return copied


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(BUFFER_SIZE):
            digest.update(block)
    return digest.hexdigest()


def record_fetch(
    version: ModelVersion,
    host_name: str,
    *,
    files: int,
    bytes_hashed: int,
    started: datetime,
    finished: datetime | None = None,
    key: str = "",
) -> VerificationRun | None:
    """A fetch that verified every file on arrival counts as a passing verification on that host.

    `key`: a fleet agent's report names its fetch (deployment, start token, host) so a batch the agent
    sends again after losing the control plane's answer records nothing twice; None for a replay.
    """
    with transaction.atomic():
        if key and VerificationRun.objects.filter(fetch_key=key).exists():
            return None
        try:
            # A savepoint: two syncs of the same replayed batch racing end in one row, not an error.
            with transaction.atomic():
                run = VerificationRun.objects.create(
                    version=version,
                    host_name=host_name,
                    ok=True,
                    manifest_digest=version.manifest_digest,
                    files_checked=files,
                    bytes_hashed=bytes_hashed,
                    trigger="fetch",
                    started_at=started,
                    finished_at=finished or timezone.now(),
                    fetch_key=key,
                )
        except IntegrityError:
            return None
        refresh_version_state(version)
    return run


def describe(store: ModelStore) -> dict[str, Any]:
    """What an agent needs to know of a store (never a credential: those stay on the host)."""
    return {
        "kind": store.kind,
        "location": store.location,
        "name": store.name,
        "endpoint_url": store.endpoint_url,
        "region": store.region,
    }
