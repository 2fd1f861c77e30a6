"""Where a run's two sides are reached: a plain base URL, or a fleet deployment resolved by a layer above.

The registry may not import the fleet (nodes/), so it cannot look deployments up itself. Instead the
fleet registers a DeploymentResolver at start-up (nodes.apps.NodesConfig.ready); the run API and the
run task ask it for a deployment's endpoint. The engine key it returns is derived afresh at each call
(it changes at every launch) and never stored: a run keeps only the deployment's id, its base URL and
served name, and a snapshot of what it was (`info`).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
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
    # A deployment's state as the fleet knows it ("ready" ...); None for a plain base URL.
    state: str | None = None
    # The sampling parameters of a greedy generation on this engine (EvalRun.greedy).
    greedy: dict[str, Any] = field(default_factory=dict)


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


def not_ready(side: str, deployment_name: str | None, state: str | None) -> str | None:
    """Why a fleet deployment cannot be a run's side now (None: it is ready). A run against an engine
    that is not serving would fail every request and measure nothing."""
    if state is None or state == "ready":
        return None
    return (
        f"The {side} deployment '{deployment_name}' is {state}, not ready: start it, or wait until it is "
        "ready, then start the run."
    )


# `owned_by` in /v1/models says which server answers: vLLM (and the simulator) write "vllm",
# llama-cpp-python's server "me", llama.cpp's own server "llamacpp".
OWNERS = {"vllm": "vllm", "me": "llamacpp", "llamacpp": "llamacpp"}


@dataclass(frozen=True)
class Probe:
    """What a plain base URL's /v1/models said: why it cannot be a side (None: it can), and its kind."""

    problem: str | None
    engine: str = "unknown"


def probe_base_url(base_url: str, model: str, timeout: float) -> Probe:
    """Whether a plain base URL can be a run's side now: it answers /v1/models and serves the model;
    and which kind of engine it is, from the listing's `owned_by` (what greedy means depends on it)."""
    url = f"{base_url}/v1/models"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            listed = [m for m in json.loads(response.read()).get("data", []) if isinstance(m, dict)]
    except urllib.error.HTTPError as exc:
        return Probe(
            f"{url} answered {exc.code}; the run needs an engine that lists its models without a key."
        )
    except (OSError, ValueError, AttributeError) as exc:
        reason = getattr(exc, "reason", exc)
        return Probe(f"No engine answers at {url} ({reason}): start it, or check the URL.")
    served = {str(m.get("id")): str(m.get("owned_by")) for m in listed}
    if model not in served:
        names = ", ".join(served) or "nothing"
        return Probe(f"The engine at {base_url} does not serve '{model}' (it serves: {names}).")
    return Probe(None, OWNERS.get(served[model], "unknown"))
