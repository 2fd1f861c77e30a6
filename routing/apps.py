from django.apps import AppConfig


class RoutingConfig(AppConfig):
    name = "routing"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Rollout and shadow saves publish a config change to the proxies.
        from routing.signals import connect  # imports routing.models: only once apps are ready

        connect()
