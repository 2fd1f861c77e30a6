from django.apps import AppConfig


class ModelsRegistryConfig(AppConfig):
    name = "models_registry"
    default_auto_field = "django.db.models.BigAutoField"
