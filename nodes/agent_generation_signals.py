"""The writes that move a host's agent generation (nodes/agent_generation.py), wired to the models.

Kept apart from agent_generation, which nodes.models imports (its bulk `update` bumps): these receivers
read the models, and the two must not import each other.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models.signals import post_delete, post_save

from nodes.agent_generation import HEARTBEAT_FIELDS, bump
from nodes.models import AgentToken, Deployment, DeploymentMember, Gpu, Host


def bump_hosts_of_deployments(deployment_ids: Iterable[int]) -> None:
    ids = list(deployment_ids)
    if ids:
        bump(Deployment.objects.filter(pk__in=ids).values_list("host__name", flat=True))


def _bump_host_ids(host_ids: Iterable[int | None]) -> None:
    ids = [i for i in host_ids if i is not None]
    if ids:
        bump(Host.objects.filter(pk__in=ids).values_list("name", flat=True))


def _on_host_saved(sender: Any, instance: Any, update_fields: Any = None, **_: Any) -> None:
    if update_fields is None or set(update_fields) - HEARTBEAT_FIELDS:
        bump([instance.name])


def _on_host_deleted(sender: Any, instance: Any, **_: Any) -> None:
    bump([instance.name])


def _on_host_row(sender: Any, instance: Any, **_: Any) -> None:
    """A row that belongs to one host (a deployment, a GPU, an agent token) was written or deleted."""
    _bump_host_ids([instance.host_id])


def _on_member(sender: Any, instance: Any, **_: Any) -> None:
    head = Deployment.objects.filter(pk=instance.deployment_id).values_list("host_id", flat=True).first()
    _bump_host_ids([instance.host_id, head])


def connect() -> None:
    """Wire the bumps to the models' writes (NodesConfig.ready); bulk updates bump in the querysets."""
    post_save.connect(_on_host_saved, sender=Host, dispatch_uid="agent_generation.host")
    post_delete.connect(_on_host_deleted, sender=Host, dispatch_uid="agent_generation.host_deleted")
    for model in (Deployment, Gpu, AgentToken):
        for signal in (post_save, post_delete):
            signal.connect(_on_host_row, sender=model, dispatch_uid=f"agent_generation.{model.__name__}")
    for signal in (post_save, post_delete):
        signal.connect(_on_member, sender=DeploymentMember, dispatch_uid="agent_generation.member")
