from django.apps import AppConfig


class InferchainConfig(AppConfig):
    """The project wiring as an app, so that its management commands (seed_demo) are found."""

    name = "inferchain"
