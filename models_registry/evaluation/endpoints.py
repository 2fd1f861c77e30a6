"""Where a run's two sides are reached: a plain base URL, or a fleet deployment resolved by a layer above.

The registry may not import the fleet (nodes/), so it cannot look deployments up itself. Instead the
fleet registers a DeploymentResolver at start-up (nodes.apps.NodesConfig.ready); the run API and the
run task ask it for a deployment's endpoint. The engine key it returns is derived afresh at each call
(it changes at every launch) and never stored: a run keeps only the deployment's id, its base URL and
served name, and a snapshot of what it was (`info`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from models_registry.chat_template import ChatTemplate


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible engine: base URL (no /v1), served model name, and its key if it wants one."""

    base_url: str
    model: str
    api_key: str | None = field(default=None, repr=False)
    # What stood behind it: deployment name, model version, engine, launch arguments (JSON-ready).
    info: dict[str, Any] = field(default_factory=dict)
    # The chat template of the model it serves, when the registry knows it (a GGUF version): a run
    # rebuilds the prompt text with it to teacher-force an engine that scores only text (llama.cpp).
    chat_template: ChatTemplate | None = field(default=None, repr=False)


class DeploymentResolver(Protocol):
    def endpoint(self, deployment_id: int) -> Endpoint | None:
        """The deployment's endpoint, or None when there is no such deployment."""

    def deployment_of_version(self, model_version_id: int) -> int | None:
        """A ready deployment serving the given model version (the reference a lineage parent gives)."""

    def model_version_of(self, deployment_id: int) -> int | None:
        """The model version a deployment serves."""


_resolver: DeploymentResolver | None = None


def register_resolver(resolver: DeploymentResolver | None) -> None:
    """Install the fleet's resolver (called once at start-up; None removes it)."""
    global _resolver
    _resolver = resolver


def resolver() -> DeploymentResolver | None:
    return _resolver


class EndpointUnavailable(Exception):
    """A side's deployment is gone or no resolver is installed."""


def deployment_endpoint(deployment_id: int) -> Endpoint:
    if _resolver is None:
        raise EndpointUnavailable("No deployment resolver is installed (the fleet app is not loaded).")
    found = _resolver.endpoint(deployment_id)
    if found is None:
        raise EndpointUnavailable(f"Deployment {deployment_id} does not exist.")
    return found
