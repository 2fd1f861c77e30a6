"""The names an API key's scope may name: every `model` a request can reach through the proxy.

An alias of the registry, the served name of a deployment (whatever its state: a scope may be set before
its engines start), the alias of a route pool or policy, or a static endpoint's. Console checks a key's
scopes against these and offers them in the key dialog; it cannot import the registry or routing, so
routing hands it this function at start (console/scopes.py, routing/apps.py).
"""

from __future__ import annotations

from models_registry.models import ModelAlias
from nodes.models import Deployment
from routing.models import RoutePolicy, RoutePool
from routing.proxy.config import static_aliases


def scopable_aliases() -> set[str]:
    """Every alias name a key may be scoped to (four small queries, on a console write or the dialog)."""
    names = set(ModelAlias.objects.values_list("name", flat=True))
    names |= set(Deployment.objects.values_list("served_model_name", flat=True).distinct())
    names |= set(RoutePool.objects.values_list("alias", flat=True))
    names |= set(RoutePolicy.objects.values_list("alias", flat=True))
    names |= static_aliases()
    names.discard("")
    return names
