"""The launch's side of the model store: what to fetch for a deployment, and where the engine then loads it.

Reads the manifest and the host's running versions from the control plane, hands them to
nodes/agent/modelstore.py (which touches no database) and records the verified arrival.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.utils import timezone

from models_registry import store as model_store
from models_registry.models import ModelStore
from nodes.agent.modelstore import StoreConfig, WantedFile, fetch_version
from nodes.choices import ACTIVE_STATES
from nodes.models import Deployment

log = logging.getLogger(__name__)


def in_use_digests(host_name: str, *, exclude_id: int | None = None) -> set[str]:
    """Manifest digests of the versions engines on this host use (never evicted while they run)."""
    rows = Deployment.objects.filter(host__name=host_name, state__in=ACTIVE_STATES)
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
