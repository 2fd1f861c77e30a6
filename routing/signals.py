"""Rollout and shadow changes reach the proxies: every save or delete publishes a config change.

Connected in RoutingConfig.ready(), so whichever code saves a Rollout or ShadowConfig (the rollout
services, the gate task, the admin, a shell) the proxies reload within a second. `QuerySet.update()`
sends no signal: callers of it use routing.services.publish_rollout_change themselves.
"""

from __future__ import annotations

from typing import Any

from django.db.models.signals import post_delete, post_save

from routing.models import Rollout, ShadowConfig
from routing.services import publish_rollout_change

KINDS = {Rollout: "rollout", ShadowConfig: "shadow_config"}


def _changed(sender: Any, instance: Rollout | ShadowConfig, **_: Any) -> None:
    publish_rollout_change(KINDS[sender], instance.pk, instance.alias_id)


def connect() -> None:
    for model in KINDS:
        post_save.connect(_changed, sender=model, dispatch_uid=f"publish-{KINDS[model]}-save")
        post_delete.connect(_changed, sender=model, dispatch_uid=f"publish-{KINDS[model]}-delete")
