"""Enumerations shared by the nodes app: engines, host and deployment states, node roles."""

from __future__ import annotations

from django.db import models


class Engine(models.TextChoices):
    VLLM = "vllm", "vLLM"
    LLAMACPP = "llamacpp", "llama.cpp"
    SIM = "sim", "vLLM simulator"


class MultiHostBackend(models.TextChoices):
    """How a deployment that spans hosts runs its workers there (vLLM's --distributed-executor-backend).

    Ray: each host's agent starts a Ray node first and vLLM places its workers on the cluster. mp: no
    cluster; every host runs `vllm serve` itself, the head with `--nnodes N --node-rank 0`, the others
    `--headless` with their rank, and their workers meet in one torch.distributed group at the head's
    master port (docs/deploying.md, "One model across hosts").
    """

    RAY = "ray", "Ray"
    MP = "mp", "Multiprocessing (vLLM --nnodes, no Ray)"


class HostState(models.TextChoices):
    # No heartbeat seen yet: the agent has never started on this host.
    UNKNOWN = "unknown", "Unknown"
    ONLINE = "online", "Online"
    # Heartbeats stopped for longer than NODE_UNREACHABLE_SECONDS.
    UNREACHABLE = "unreachable", "Unreachable"
    # Admin-set: keep running engines, accept no new deployments.
    DRAINING = "draining", "Draining"


class DesiredState(models.TextChoices):
    RUNNING = "running", "Running"
    STOPPED = "stopped", "Stopped"


class DeploymentState(models.TextChoices):
    PENDING = "pending", "Pending"
    VERIFYING = "verifying", "Verifying files"
    STARTING = "starting", "Starting"
    READY = "ready", "Ready"
    # Alive but not fully serving: readiness probe failing, or the host stopped heartbeating.
    DEGRADED = "degraded", "Degraded"
    # The process exited or hung; the agent restarts it with backoff.
    CRASHED = "crashed", "Crashed"
    # Too many failed restarts, or refused at launch: needs a person.
    FAILED = "failed", "Failed"
    STOPPING = "stopping", "Stopping"
    STOPPED = "stopped", "Stopped"
    # vLLM's sleep mode: the process lives and keeps its port, its weights are in host memory (level 1)
    # or dropped (level 2) and its KV cache is freed; POST /wake_up brings it back to ready.
    SLEEPING = "sleeping", "Sleeping"


# States in which an engine process may exist and hold its port and GPU memory.
ACTIVE_STATES = frozenset(
    {
        DeploymentState.PENDING,
        DeploymentState.VERIFYING,
        DeploymentState.STARTING,
        DeploymentState.READY,
        DeploymentState.DEGRADED,
        DeploymentState.CRASHED,
        DeploymentState.STOPPING,
        DeploymentState.SLEEPING,
    }
)

# Engines whose server has vLLM's sleep mode (/sleep, /wake_up, /is_sleeping); llama.cpp has none.
SLEEP_CAPABLE_ENGINES = frozenset({Engine.VLLM, Engine.SIM})
SLEEP_LEVELS = (1, 2)

# Suggested role labels; any other free-form label is accepted.
NODE_ROLES = ("long-context", "high-throughput", "cpu-postprocess")
