"""Domain logic of the model registry: register, verify, estimate and alias. Views and tasks call these."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from core.audit import record_audit
from core.choices import AuditAction
from core.live import push_live_event
from core.redis_client import publish_config_change
from models_registry.choices import ProblemKind, SourceKind, VersionState
from models_registry.estimate import (
    DEFAULT_OVERHEAD_BYTES,
    ArchitectureError,
    FitResult,
    MemoryEstimate,
    Step,
    estimate_memory,
    fit_architecture,
    read_directory,
    read_gguf,
)
from models_registry.hashing import (
    FileHash,
    SourcePathError,
    TreeHash,
    hash_files,
    hash_tree,
    is_weight_file,
    list_files,
    local_host_name,
    manifest_digest,
    resolve_source,
)
from models_registry.models import (
    ManifestFile,
    Model,
    ModelAlias,
    ModelVersion,
    QuantizationConfig,
    VerificationRun,
)

__all__ = [
    "ArchitectureError",
    "FitResult",
    "ManifestEntry",
    "ManifestError",
    "MemoryEstimate",
    "RegistrationError",
    "SourcePathError",
    "Step",
    "TreeHash",
    "estimate_memory",
    "fit_check",
    "hash_tree",
    "is_verified_on_host",
    "parse_manifest",
    "register_version",
    "state_on_host",
    "switch_alias",
    "verify_version_on_host",
]

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
logger = logging.getLogger(__name__)


class ManifestError(ValueError):
    """An uploaded manifest that cannot be accepted: bad syntax, a bad hash, a path listed twice..."""


class RegistrationError(ValueError):
    """Registration refused; `problems` names each file that failed, in the verification-problem shape."""

    def __init__(self, message: str, problems: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or []


@dataclass(frozen=True)
class ManifestEntry:
    """One line of a manifest: path relative to the source, size (None when unknown) and sha256."""

    path: str
    size: int | None
    sha256: str


# --------------------------------------------------------------------------- manifests


def _clean_manifest_path(raw: Any, line: str) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise ManifestError(f"{line}: path must be a non-empty string.")
    path = raw.strip().replace("\\", "/")
    if path.startswith("*"):
        # sha256sum marks binary mode with a leading star.
        path = path[1:]
    if path.startswith("./"):
        path = path[2:]
    parts = path.split("/")
    if path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ManifestError(f"{line}: path {raw!r} must be relative to the source, without '..'.")
    return path


def parse_manifest(text: str) -> list[ManifestEntry]:
    """Parse a manifest: JSON ({"files": [{path, size, sha256}]} or a bare list) or `sha256sum` output."""
    entries: list[ManifestEntry] = []
    stripped = text.strip()
    if not stripped:
        raise ManifestError("The manifest is empty.")
    if stripped[0] in "[{":
        try:
            data = json.loads(stripped)
        except ValueError as exc:
            raise ManifestError(f"The manifest is not valid JSON ({exc}).") from None
        items = data.get("files") if isinstance(data, dict) else data
        if not isinstance(items, list):
            raise ManifestError('A JSON manifest must be a list of files or {"files": [...]}.')
        for index, item in enumerate(items):
            where = f"files[{index}]"
            if not isinstance(item, dict):
                raise ManifestError(f"{where}: expected an object with path, size and sha256.")
            sha = str(item.get("sha256", "")).strip().lower()
            if not SHA256_RE.match(sha):
                raise ManifestError(f"{where}: sha256 must be 64 hex digits.")
            size = item.get("size")
            if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
                raise ManifestError(f"{where}: size must be a non-negative integer.")
            entries.append(ManifestEntry(_clean_manifest_path(item.get("path"), where), size, sha))
    else:
        for number, raw_line in enumerate(text.splitlines(), start=1):
            line = raw_line.strip()
            if not line or line.startswith("#"):
                continue
            where = f"line {number}"
            parts = line.split(None, 1)
            if len(parts) != 2 or not SHA256_RE.match(parts[0].lower()):
                raise ManifestError(f"{where}: expected '<sha256>  <path>' as sha256sum writes it.")
            entries.append(ManifestEntry(_clean_manifest_path(parts[1], where), None, parts[0].lower()))
    seen: set[str] = set()
    for entry in entries:
        if entry.path in seen:
            raise ManifestError(f"The manifest lists {entry.path} twice.")
        seen.add(entry.path)
    if not entries:
        raise ManifestError("The manifest lists no files.")
    return entries


def compare_with_manifest(
    expected: Mapping[str, tuple[int | None, str]],
    hashed: list[FileHash],
    unreadable: list[tuple[str, str]],
    present: set[str],
) -> list[dict[str, Any]]:
    """Problems in the verification shape: [{path, kind, expected, actual, detail}], sorted by path."""
    problems: list[dict[str, Any]] = []
    unreadable_paths = {path for path, _ in unreadable}
    for path, message in unreadable:
        exp = expected.get(path)
        problems.append(
            {
                "path": path,
                "kind": ProblemKind.UNREADABLE.value,
                "expected": exp[1] if exp else None,
                "actual": None,
                "detail": message,
            }
        )
    by_path = {f.path: f for f in hashed}
    for path, (size, sha) in expected.items():
        if path in unreadable_paths:
            continue
        got = by_path.get(path)
        if got is None:
            if path not in present:
                problems.append(
                    {
                        "path": path,
                        "kind": ProblemKind.MISSING.value,
                        "expected": sha,
                        "actual": None,
                        "detail": "",
                    }
                )
            continue
        if got.sha256 != sha or (size is not None and got.size != size):
            detail = (
                f"size {got.size:,} B, expected {size:,} B" if size is not None and got.size != size else ""
            )
            problems.append(
                {
                    "path": path,
                    "kind": ProblemKind.MISMATCH.value,
                    "expected": sha,
                    "actual": got.sha256,
                    "detail": detail,
                }
            )
    for path in sorted(present - set(expected) - unreadable_paths):
        if is_weight_file(path):
            got = by_path.get(path)
            problems.append(
                {
                    "path": path,
                    "kind": ProblemKind.EXTRA.value,
                    "expected": None,
                    "actual": got.sha256 if got else None,
                    "detail": "weight file not in the manifest",
                }
            )
    problems.sort(key=lambda p: (p["path"], p["kind"]))
    return problems


# --------------------------------------------------------------------------- registration


def read_architecture(root: Path, kind: str) -> tuple[dict[str, Any], int | None, int | None, str | None]:
    """(architecture, parameter count, max context, tokenizer path) for a resolved source."""
    if kind == SourceKind.GGUF:
        gguf_arch, gguf_params, gguf_context = read_gguf(root)
        return gguf_arch, gguf_params, gguf_context, str(root)
    arch, params, context, tokenizer = read_directory(root)
    # A directory may hold a single GGUF and no config.json (a llama.cpp model folder).
    if not arch:
        ggufs = sorted(root.glob("*.gguf"))
        if len(ggufs) == 1:
            arch, gguf_params, context = read_gguf(ggufs[0])
            params = gguf_params
            tokenizer = tokenizer or str(ggufs[0])
    return arch, params, context, tokenizer


def unreadable_files_error(errors: Iterable[Any]) -> RegistrationError:
    """One RegistrationError naming every file that could not be read (each with .rel_path, .message)."""
    errors = list(errors)
    problems = [
        {
            "path": e.rel_path,
            "kind": ProblemKind.UNREADABLE.value,
            "expected": None,
            "actual": None,
            "detail": e.message,
        }
        for e in errors
    ]
    return RegistrationError(
        "Some files could not be read: " + "; ".join(f"{e.rel_path}: {e.message}" for e in errors), problems
    )


def register_version(
    *,
    model: Model,
    revision: str,
    source_path: str,
    manifest: list[ManifestEntry] | None = None,
    quantization: QuantizationConfig | None = None,
    parent: ModelVersion | None = None,
    parameter_count: int | None = None,
    max_context: int | None = None,
    actor: Any = None,
    host_name: str | None = None,
) -> ModelVersion:
    """Hash a source's files and record the version with its manifest, all or nothing.

    Without `manifest` the files found become the manifest. With one, the files must match it
    exactly (RegistrationError lists each bad file). Either way the registering host gets a
    verification run, so the version starts out verified there.
    """
    revision = revision.strip()
    if not revision:
        raise RegistrationError("revision must not be empty.")
    if ModelVersion.objects.filter(model=model, revision=revision).exists():
        raise RegistrationError(f"{model.name} already has a version with revision {revision!r}.")
    if parent is not None and parent.parent_id is not None:
        raise RegistrationError("parent must be a full-precision version (one with no parent of its own).")

    root, kind = resolve_source(source_path)
    host = host_name or local_host_name()
    started = timezone.now()
    listing = list_files(root)
    if listing.errors:
        raise unreadable_files_error(listing.errors)
    files = listing.files
    if manifest is not None:
        # Only the manifest's files are pinned; other files in the directory are checked for extra weights.
        wanted = {e.path for e in manifest}
        to_hash = [f for f in files if f.rel_path in wanted or is_weight_file(f.rel_path)]
    else:
        to_hash = files
    if not to_hash and manifest is None:
        raise RegistrationError(f"{source_path}: contains no files.")
    tree = hash_files(to_hash, host_name=host)
    if tree.unreadable:
        raise unreadable_files_error(tree.unreadable)

    if manifest is not None:
        expected = {e.path: (e.size, e.sha256) for e in manifest}
        problems = compare_with_manifest(expected, tree.files, [], {f.rel_path for f in files})
        if problems:
            raise RegistrationError(
                "The files do not match the manifest: "
                + "; ".join(f"{p['path']}: {p['kind']}" for p in problems),
                problems,
            )
        pinned = [f for f in tree.files if f.path in expected]
    else:
        pinned = tree.files

    arch, found_params, found_context, tokenizer = read_architecture(root, kind)
    digest = manifest_digest((f.path, f.size, f.sha256) for f in pinned)
    try:
        return _save_registration(
            model=model,
            revision=revision,
            kind=kind,
            root=root,
            parameter_count=parameter_count or found_params,
            max_context=max_context or found_context,
            arch=arch,
            tokenizer=tokenizer,
            digest=digest,
            pinned=pinned,
            tree=tree,
            parent=parent,
            quantization=quantization,
            actor=actor,
            host=host,
            started=started,
        )
    except IntegrityError:
        # Another registration of the same revision won the race while we were hashing.
        raise RegistrationError(f"{model.name} already has a version with revision {revision!r}.") from None


def _save_registration(
    *,
    model: Model,
    revision: str,
    kind: str,
    root: Path,
    parameter_count: int | None,
    max_context: int | None,
    arch: dict[str, Any],
    tokenizer: str | None,
    digest: str,
    pinned: list[FileHash],
    tree: TreeHash,
    parent: ModelVersion | None,
    quantization: QuantizationConfig | None,
    actor: Any,
    host: str,
    started: Any,
) -> ModelVersion:
    """Write the version, its manifest, its first verification run and the audit event in one transaction."""
    with transaction.atomic():
        version = ModelVersion.objects.create(
            model=model,
            revision=revision,
            source_kind=kind,
            source_path=str(root),
            parameter_count=parameter_count,
            max_context=max_context,
            architecture=arch,
            tokenizer_path=tokenizer,
            state=VersionState.VERIFIED,
            manifest_digest=digest,
            file_count=len(pinned),
            total_bytes=sum(f.size for f in pinned),
            parent=parent,
            quantization=quantization,
            created_by=actor if getattr(actor, "pk", None) else None,
        )
        ManifestFile.objects.bulk_create(
            [ManifestFile(version=version, path=f.path, size=f.size, sha256=f.sha256) for f in pinned]
        )
        VerificationRun.objects.create(
            version=version,
            host_name=host,
            ok=True,
            manifest_digest=digest,
            problems=[],
            files_checked=len(pinned),
            bytes_hashed=tree.bytes_hashed,
            cache_hits=tree.cache_hits,
            trigger="registration",
            started_at=started,
            finished_at=timezone.now(),
        )
        if not model.architecture and arch.get("architectures"):
            model.architecture = str(arch["architectures"][0])
            model.save(update_fields=["architecture", "updated_at"])
        record_audit(
            actor=actor,
            action=AuditAction.CREATE,
            obj=version,
            after={
                "model": model.name,
                "revision": revision,
                "source_path": str(root),
                "manifest_digest": digest,
                "file_count": len(pinned),
                "parent": parent.pk if parent else None,
                "quantization": quantization.name if quantization else None,
            },
        )
    return version


# --------------------------------------------------------------------------- verification


def verify_version_on_host(
    version_id: int, host_name: str | None = None, trigger: str = "task"
) -> VerificationRun:
    """Re-hash a version's files on this host, compare with the manifest and record the run.

    Runs where the files live (the node agent of `host_name`); the stat cache makes a repeat on
    unchanged files cheap. A mismatch, missing or extra weight file fails the version on this host.
    """
    version = ModelVersion.objects.get(pk=version_id)
    host = host_name or local_host_name()
    started = timezone.now()
    expected = {f.path: (f.size, f.sha256) for f in version.files.all()}
    root = Path(version.source_path)
    unreadable: list[tuple[str, str]] = []
    hashed: list[FileHash] = []
    present: set[str] = set()
    bytes_hashed = 0
    cache_hits = 0
    try:
        resolved, _ = resolve_source(root)
    except SourcePathError as exc:
        resolved = None
        if root.exists() or root.is_symlink():
            unreadable.append((".", str(exc)))
    if resolved is not None:
        listing = list_files(resolved)
        unreadable.extend((e.rel_path, e.message) for e in listing.errors)
        present = {f.rel_path for f in listing.files}
        to_hash = [f for f in listing.files if f.rel_path in expected or is_weight_file(f.rel_path)]
        tree = hash_files(to_hash, host_name=host)
        unreadable.extend((e.rel_path, e.message) for e in tree.unreadable)
        hashed = tree.files
        bytes_hashed = tree.bytes_hashed
        cache_hits = tree.cache_hits
    problems = compare_with_manifest(expected, hashed, unreadable, present)
    with transaction.atomic():
        run = VerificationRun.objects.create(
            version=version,
            host_name=host,
            ok=not problems,
            manifest_digest=version.manifest_digest,
            problems=problems,
            files_checked=len(expected),
            bytes_hashed=bytes_hashed,
            cache_hits=cache_hits,
            trigger=trigger,
            started_at=started,
            finished_at=timezone.now(),
        )
        state = refresh_version_state(version)
        event = {
            "type": "verification",
            "version": version.pk,
            "run": run.pk,
            "host_name": host,
            "ok": run.ok,
            "problems": len(problems),
            "state": state,
        }
        transaction.on_commit(lambda: push_verification_event(version.pk, event))
    return run


def version_group(version_id: int) -> str:
    """The live group a version's page subscribes to."""
    return f"live.model_version.{version_id}"


def push_verification_event(version_id: int, event: dict[str, Any]) -> None:
    """Tell open pages of this version that a verification finished.

    Best effort: the run is already stored, so a Redis hiccup must not fail the task that made it.
    """
    try:
        push_live_event(version_group(version_id), event)
    except Exception:
        logger.warning("Could not push the verification event of version %s", version_id, exc_info=True)


def latest_runs(version: ModelVersion) -> dict[str, VerificationRun]:
    """The newest verification run per host for the version's current manifest."""
    latest: dict[str, VerificationRun] = {}
    runs = version.verifications.filter(manifest_digest=version.manifest_digest).order_by(
        "-started_at", "-id"
    )
    for run in runs:
        latest.setdefault(run.host_name, run)
    return latest


def refresh_version_state(version: ModelVersion) -> str:
    """Failed if any host's latest run failed, verified if some host's passed, else registered."""
    latest = latest_runs(version)
    if any(not run.ok for run in latest.values()):
        state = VersionState.FAILED
    elif latest:
        state = VersionState.VERIFIED
    else:
        state = VersionState.REGISTERED
    if version.state != state:
        version.state = state
        version.save(update_fields=["state", "updated_at"])
    return state


def is_verified_on_host(version: ModelVersion, host_name: str) -> bool:
    """True when the latest run on `host_name` passed against the current manifest; deploy only then."""
    run = (
        version.verifications.filter(host_name=host_name, manifest_digest=version.manifest_digest)
        .order_by("-started_at", "-id")
        .first()
    )
    return run is not None and run.ok


def state_on_host(version: ModelVersion, host_name: str) -> str:
    """ "verified", "failed" or "registered" (never checked there) for this version on one host.

    What a deployment preflight should check: a failure on another host says nothing about this one.
    """
    run = (
        version.verifications.filter(host_name=host_name, manifest_digest=version.manifest_digest)
        .order_by("-started_at", "-id")
        .first()
    )
    if run is None:
        return VersionState.REGISTERED
    return VersionState.VERIFIED if run.ok else VersionState.FAILED


# --------------------------------------------------------------------------- estimates


def fit_check(
    version: ModelVersion,
    quantization: QuantizationConfig | str | None,
    gpu_memory_bytes: int,
    gpu_memory_utilization: float | None,
    max_model_len: int,
    max_num_seqs: int | None,
    other_reserved_bytes: int = 0,
    overhead_bytes: int = DEFAULT_OVERHEAD_BYTES,
    kv_cache_dtype: str | None = None,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    gpu_name: str = "",
    max_num_batched_tokens: int | None = None,
) -> FitResult:
    """Will `version` fit on a GPU with this much memory? Raises ArchitectureError when it cannot tell.

    `quantization` None means the version's own quantization config (or its checkpoint as it is).
    `other_reserved_bytes` is memory other deployments on the same GPU already claim. With tensor
    parallelism, pass the memory of all its GPUs and `tensor_parallel_size` (overhead is per GPU).
    """
    return fit_architecture(
        version.architecture,
        max_context=version.max_context,
        quantization=quantization if quantization is not None else version.quantization,
        gpu_memory_bytes=gpu_memory_bytes,
        gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        other_reserved_bytes=other_reserved_bytes,
        overhead_bytes=overhead_bytes,
        kv_cache_dtype=kv_cache_dtype,
        tensor_parallel_size=tensor_parallel_size,
        pipeline_parallel_size=pipeline_parallel_size,
        gpu_name=gpu_name,
        max_num_batched_tokens=max_num_batched_tokens,
    )


# --------------------------------------------------------------------------- aliases


def switch_alias(alias: ModelAlias, version: ModelVersion, *, actor: Any) -> ModelAlias:
    """Point `alias` at `version`: audited, and pushed to every proxy. Refuses a failed version."""
    if version.state == VersionState.FAILED:
        raise RegistrationError(f"{version} failed verification; fix or re-verify it before switching to it.")
    with transaction.atomic():
        locked = (
            ModelAlias.objects.select_for_update().select_related("active_version__model").get(pk=alias.pk)
        )
        old = locked.active_version
        if old.pk == version.pk:
            return locked
        locked.active_version = version
        locked.save(update_fields=["active_version", "updated_at"])
        record_audit(
            actor=actor,
            action=AuditAction.SWITCH,
            obj=locked,
            before={"active_version": old.pk, "version": str(old)},
            after={"active_version": version.pk, "version": str(version)},
        )
        publish_config_change("model_alias", name=locked.name, active_version=version.pk)
    alias.active_version = version
    return locked
