from django.apps import AppConfig


class CoreConfig(AppConfig):
    """The shared floor every domain app builds on: audit trail, live push, Redis, Celery, API bases."""

    name = "core"
    default_auto_field = "django.db.models.BigAutoField"
