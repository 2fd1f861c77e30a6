from __future__ import annotations

from django.apps import AppConfig


class NodesConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "nodes"

    def ready(self) -> None:
        from core.celery import app

        # The bound for "unreachable" is NODE_UNREACHABLE_SECONDS after the last heartbeat plus this
        # period (docs/nodes.md); the sweep is one indexed query.
        app.conf.beat_schedule = {
            **(app.conf.beat_schedule or {}),
            "nodes-host-heartbeat-sweep": {"task": "nodes.check_host_heartbeats", "schedule": 2.0},
        }
