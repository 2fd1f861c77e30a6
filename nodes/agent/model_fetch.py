"""The launch's side of the model store: what to fetch for a deployment, and where the engine then loads it.

Reads the manifest and the host's running versions from the control plane, hands them to
nodes/agent/modelstore.py (which touches no database) and records the verified arrival.
"""

from __future__ import annotations

import logging
from pathlib import Path

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from models_registry import store as model_store
from models_registry.models import ModelStore
from nodes.agent.modelstore import StoreConfig, WantedFile, fetch_version
from nodes.choices import ACTIVE_STATES
from nodes.models import Deployment, Host

log = logging.getLogger(__name__)


def in_use_digests(host_name: str, *, exclude_id: int | None = None) -> set[str]:
    """Manifest digests of the versions engines on this host use (never evicted while they run): its own
    deployments' and those of deployments spanning hosts it holds a pipeline stage of."""
    rows = Deployment.objects.filter(
        Q(host__name=host_name) | Q(members__host__name=host_name), state__in=ACTIVE_STATES
    ).distinct()
    if exclude_id is not None:
        rows = rows.exclude(pk=exclude_id)
    return set(rows.values_list("model_version__manifest_digest", flat=True))


def fetch_for_launch(deployment: Deployment, store: ModelStore) -> str:
    """Fetch the deployment's version into this host's model root; the path the engine loads.

    Raises modelstore.FetchError (a refused file, an unreachable store, no room) with the reason.
    """
    version = deployment.model_version
    started = timezone.now()
    files = [WantedFile(path, size, sha) for path, size, sha in model_store.manifest_of(version)]
    result = fetch_version(
        StoreConfig(**model_store.describe(store)),
        version.manifest_digest,
        files,
        settings.NODE_MODEL_ROOT,
        max_bytes=settings.NODE_MODEL_CACHE_BYTES,
        in_use=in_use_digests(deployment.host.name, exclude_id=deployment.pk),
        retries=settings.NODE_MODEL_FETCH_RETRIES,
        retry_delay=settings.NODE_MODEL_FETCH_RETRY_SECONDS,
    )
    if not result.cached:
        log.info(
            "fetched %s from store %s: %s files, %s bytes (%s resumed), evicted %s",
            version,
            store.name,
            result.files_fetched,
            result.bytes_fetched,
            result.resumed,
            result.evicted,
        )
        model_store.record_fetch(
            version,
            deployment.host.name,
            files=len(files),
            bytes_hashed=result.bytes_verified,
            started=started,
        )
    return str(model_store.local_model_path(version, result.path))


# --- a fleet agent's host (the agent channel): the agent fetches, the control plane plans ------------


def agent_model_root(deployment: Deployment) -> Path | None:
    """The model root a fleet agent reported for the deployment's host (None: not a fleet agent's host,
    or an agent that fetches nothing)."""
    info = deployment.host.agent_info or {}
    root = info.get("model_root") if info.get("channel") == "api" else None
    return Path(str(root)) if root else None


def remote_model_path(deployment: Deployment) -> str | None:
    """What a fleet agent's engine loads while a store is active: the version's directory under the
    model root its agent reported. None when the host's files are checked in place instead."""
    store = model_store.active_store()
    root = agent_model_root(deployment)
    version = deployment.model_version
    if store is None or root is None or not version.manifest_digest:
        return None
    return str(model_store.local_model_path(version, root / version.manifest_digest))


def fetch_spec(deployment: Deployment, host: Host | None = None) -> dict[str, object] | None:
    """What a fleet agent needs to fetch the deployment's version before launching it (no credential:
    an S3 store's keys stay on the host).

    `host`: a member host of a deployment spanning hosts (default: the head). vLLM's Ray workers load
    the model from the path the head's command line names, so a member fetches the same version into
    its own model root before it starts its Ray node (the preflight refuses roots that differ).
    """
    store = model_store.active_store()
    if store is None or remote_model_path(deployment) is None:
        return None
    host = host or deployment.host
    version = deployment.model_version
    return {
        "store": model_store.describe(store),
        "digest": version.manifest_digest,
        "files": [list(row) for row in model_store.manifest_of(version)],
        "max_bytes": settings.NODE_MODEL_CACHE_BYTES,
        "in_use": sorted(in_use_digests(host.name, exclude_id=deployment.pk)),
        "retries": settings.NODE_MODEL_FETCH_RETRIES,
        "retry_delay": settings.NODE_MODEL_FETCH_RETRY_SECONDS,
    }
