from django.apps import AppConfig

from console.scopes import provide_alias_names


class RoutingConfig(AppConfig):
    name = "routing"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Rollout and shadow saves publish a config change to the proxies.
        from routing.key_scopes import scopable_aliases  # imports models: only once apps are ready
        from routing.signals import connect

        connect()
        # Console checks a key's scopes against the aliases, which it may not import: hand it the list.
        provide_alias_names(scopable_aliases)
