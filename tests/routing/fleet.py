"""Simulator engines registered as ready deployments, the way the agent would leave them."""

from __future__ import annotations

import random
import secrets
from dataclasses import dataclass

from inferchain.demo_traffic import WORDS
from models_registry.models import Model, ModelAlias, ModelVersion
from nodes.lifecycle import engine_api_key
from nodes.models import Deployment, Host
from vllm_sim import text
from vllm_sim.testing import SimHandle, free_port, start_sim

SIM_MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@dataclass
class FleetMember:
    deployment: Deployment
    sim: SimHandle


def ensure_alias(alias: str, max_context: int = 8192) -> ModelAlias:
    model, _ = Model.objects.get_or_create(name="llama-3.1-8b")
    version, _ = ModelVersion.objects.get_or_create(
        model=model,
        revision="main",
        defaults={"source_kind": "directory", "source_path": "/models/llama", "max_context": max_context},
    )
    found, _ = ModelAlias.objects.get_or_create(name=alias, defaults={"active_version": version})
    return found


def start_member(
    alias: str,
    *sim_args: str,
    role: str = "",
    max_model_len: int = 4096,
    time_scale: float = 50.0,
    version: ModelVersion | None = None,
    host: Host | None = None,
    netns: str | None = None,
) -> FleetMember:
    """A ready Deployment row plus a simulator that accepts exactly its derived engine key.

    It runs `version`, by default the alias's active version, on `host` (by default a loopback one);
    `netns` starts the simulator inside that network namespace, listening on the host's address."""
    ensure_alias(alias)
    if host is None:
        host, _ = Host.objects.get_or_create(name="sim-host", defaults={"address": "127.0.0.1"})
    port = free_port()
    dep = Deployment.objects.create(
        name=f"{alias}-{port}",
        model_version=version or ModelAlias.objects.get(name=alias).active_version,
        host=host,
        port=port,
        served_model_name=alias,
        max_model_len=max_model_len,
        role=role,
        state="ready",
        start_token=secrets.token_hex(8),
        engine="sim",
    )
    sim = start_sim(
        SIM_MODEL,
        "--served-model-name",
        alias,
        "--max-model-len",
        str(max_model_len),
        *sim_args,
        port=port,
        host=host.address,
        api_key=engine_api_key(dep),
        time_scale=time_scale,
        netns=netns,
    )
    return FleetMember(deployment=dep, sim=sim)


def sim_conversation(tokens: int) -> list[dict[str, str]]:
    """A one-message chat the simulator counts at exactly `tokens` prompt tokens."""
    rng = random.Random(tokens)
    words: list[str] = []
    messages = [{"role": "user", "content": ""}]
    while text.chat_prompt_tokens(messages) < tokens - 50:
        words.extend(rng.choice(WORDS) for _ in range(25))
        messages = [{"role": "user", "content": " ".join(words)}]
    while text.chat_prompt_tokens(messages) < tokens:
        messages = [{"role": "user", "content": messages[0]["content"] + " a"}]  # " a" is one token
    assert text.chat_prompt_tokens(messages) == tokens
    return messages
