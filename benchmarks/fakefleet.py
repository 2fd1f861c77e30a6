"""The fabricated fleet the control-plane benchmarks measure (fleet exposition, rollup writes, alert
evaluation): Django set up on a throwaway database, then hosts with GPUs and vLLM deployments spread over
them, created in bulk. Live records and request-log rows are each benchmark's own."""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def add_fleet_arguments(parser: argparse.ArgumentParser) -> None:
    """The fleet's size (100 hosts x 8 GPUs, 400 engines by default) and the database to build it in."""
    parser.add_argument("--hosts", type=int, default=100)
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per host")
    parser.add_argument("--engines", type=int, default=400)
    parser.add_argument("--database-url", default="", help="default: a scratch SQLite database")


def add_heap_argument(parser: argparse.ArgumentParser) -> None:
    """For a benchmark of what the Celery worker runs: how its heap stands (heap_as_in_a_worker)."""
    parser.add_argument(
        "--unfrozen-heap",
        action="store_true",
        help="leave the heap as the worker's was before core.celery.freeze_heap (default: frozen before "
        "the timed runs, as a worker's pool child freezes its imports at start)",
    )


def heap_as_in_a_worker(unfrozen: bool) -> None:
    """Before the timed runs: the heap frozen as a Celery pool child freezes its own at start
    (core.celery.freeze_heap), unless `unfrozen`. The fleet's rows the benchmark holds are frozen with
    it, as a worker holds none of them between runs."""
    if not unfrozen:
        from core.celery import freeze_heap

        freeze_heap()


def setup_django(name: str, database_url: str = "", **env: str) -> Path:
    """Configure and set up Django for a benchmark run; SQLite in a temp dir unless a URL is given.

    Redis keys get a prefix of their own (`bench<name><pid>:`), so a run never touches another's.
    Returns the temp dir. Migrations are applied.
    """
    tmp = Path(tempfile.mkdtemp(prefix=f"{name}-bench-"))
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "inferchain.settings",
            "DATABASE_URL": database_url or f"sqlite:///{tmp / 'db.sqlite3'}",
            "REDIS_KEY_PREFIX": f"bench{name}{os.getpid()}:",
            "SECRET_KEY": secrets.token_urlsafe(40),
            **env,
        }
    )
    sys.path.insert(0, str(REPO))
    # After the environment is set: settings are read at import.
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return tmp


@dataclass
class Fleet:
    tag: str
    version: Any
    hosts: list[Any]
    deployments: list[Any]


def create_fleet(
    prefix: str,
    *,
    hosts: int,
    gpus: int,
    engines: int,
    gpu_name: str = "NVIDIA H100 80GB HBM3",
    heartbeat: Any = None,
    state_of: Callable[[int], str] | None = None,
) -> Fleet:
    """`hosts` hosts of `gpus` GPUs, and `engines` ready vLLM deployments round-robin over them (one GPU
    each), serving 12 aliases. `state_of(d)` may give deployment d another state."""
    from models_registry.models import Model, ModelVersion
    from nodes.choices import DeploymentState, DesiredState, Engine
    from nodes.models import Deployment, Gpu, Host

    tag = secrets.token_hex(3)
    version = ModelVersion.objects.create(
        model=Model.objects.create(name=f"bench-{prefix}-{tag}"),
        revision="fp16",
        source_kind="directory",
        source_path="/models/llama",
    )
    host_rows = Host.objects.bulk_create(
        Host(
            name=f"{prefix}{tag}-gpu-{h:03d}", address=f"10.0.{h // 250}.{h % 250}", last_heartbeat=heartbeat
        )
        for h in range(hosts)
    )
    Gpu.objects.bulk_create(
        Gpu(host=host, index=i, uuid=f"GPU-{tag}-{h}-{i}", name=gpu_name, memory_total_bytes=80 * 2**30)
        for h, host in enumerate(host_rows)
        for i in range(gpus)
    )
    deployment_rows = Deployment.objects.bulk_create(
        Deployment(
            name=f"{prefix}{tag}-chat-{d:03d}",
            model_version=version,
            engine=Engine.VLLM,
            host=host_rows[d % len(host_rows)],
            gpu_indices=[(d // len(host_rows)) % gpus],
            port=8100 + d // len(host_rows),
            served_model_name=f"chat-{d % 12}",
            state=state_of(d) if state_of else DeploymentState.READY,
            desired_state=DesiredState.RUNNING,
        )
        for d in range(engines)
    )
    return Fleet(tag=tag, version=version, hosts=host_rows, deployments=deployment_rows)
