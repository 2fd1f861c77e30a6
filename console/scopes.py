"""The model aliases an API key's scope may name.

A key with a non-empty `scopes` list may call only those aliases (the proxy enforces it from its key
cache; docs/tenants.md). The aliases are known to the registry and to routing, neither of which console
may import (docs/architecture.md): the app above both, routing, hands console the function that lists
them when Django starts (`routing.apps.RoutingConfig.ready`). Without one (console on its own) a scope is
checked for its shape only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

AliasNames = Callable[[], Iterable[str]]

_source: AliasNames | None = None


def provide_alias_names(source: AliasNames) -> None:
    """Set the function that lists every alias name a scope may name (called once, at start)."""
    global _source
    _source = source


def alias_names() -> list[str] | None:
    """Every alias a key may be scoped to, sorted; None when no app has said which there are."""
    return None if _source is None else sorted(set(_source()))
