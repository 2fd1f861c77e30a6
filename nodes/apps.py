from __future__ import annotations

from django.apps import AppConfig


class NodesConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "nodes"

    def ready(self) -> None:
        # Evaluation runs name deployments by id; the registry below cannot look them up itself.
        from models_registry.evaluation.endpoints import register_resolver  # apps are loaded only now
        from nodes.evaluation import FleetResolver  # imports nodes.models: only once apps are ready

        register_resolver(FleetResolver())
        # Writes that change what a host's agent is told move its generation (routine syncs skip Django).
        from nodes import agent_generation_signals

        agent_generation_signals.connect()
        # The agent's tasks, registered in every process: services send them by name, and with
        # CELERY_TASK_ALWAYS_EAGER a name must resolve to the task here to run in place.
        from nodes import tasks  # noqa: F401 - imports nodes.models: only once apps are ready
