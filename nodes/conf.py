"""Node supervision settings, read from Django settings when set there, else from the environment.

Kept in the app (not console/settings.py) so the nodes package owns its knobs; tests override them
with pytest-django's `settings` fixture like any other setting. docs/nodes.md explains each.
"""

from __future__ import annotations

from pathlib import Path

from django.conf import settings

from console.env import env_float, env_int

DEFAULTS: dict[str, float | int] = {
    # Telemetry and supervision tick of the agent.
    "NODE_TELEMETRY_SECONDS": env_float("NODE_TELEMETRY_SECONDS", 1.0),
    # A host with no heartbeat for this long is unreachable.
    "NODE_UNREACHABLE_SECONDS": env_float("NODE_UNREACHABLE_SECONDS", 6.0),
    # Running requests but no token progress (or no probe answered) for this long: hung.
    "NODE_HANG_SECONDS": env_float("NODE_HANG_SECONDS", 30.0),
    "NODE_STARTUP_TIMEOUT_SECONDS": env_float("NODE_STARTUP_TIMEOUT_SECONDS", 900.0),
    "NODE_STOP_TIMEOUT_SECONDS": env_float("NODE_STOP_TIMEOUT_SECONDS", 20.0),
    "NODE_MAX_RESTARTS": env_int("NODE_MAX_RESTARTS", 5),
    "NODE_RESTART_BACKOFF_SECONDS": env_float("NODE_RESTART_BACKOFF_SECONDS", 2.0),
    "NODE_RESTART_BACKOFF_MAX_SECONDS": env_float("NODE_RESTART_BACKOFF_MAX_SECONDS", 60.0),
    # Ready for this long resets the failed-restart count.
    "NODE_STABLE_SECONDS": env_float("NODE_STABLE_SECONDS", 120.0),
    # Live values in Redis expire after this, so a dead agent's numbers never look current.
    "NODE_LIVE_TTL_SECONDS": env_float("NODE_LIVE_TTL_SECONDS", 5.0),
    # GPU and engine samples kept in Redis for the console's charts (nodes/history.py).
    "NODE_HISTORY_SECONDS": env_float("NODE_HISTORY_SECONDS", 3600.0),
    "ENGINE_LOG_MAX_BYTES": env_int("ENGINE_LOG_MAX_BYTES", 20 * 1024 * 1024),
    "ENGINE_LOG_KEEP": env_int("ENGINE_LOG_KEEP", 5),
}


def node_setting(name: str) -> float:
    return float(getattr(settings, name, DEFAULTS[name]))


def node_int(name: str) -> int:
    return int(getattr(settings, name, DEFAULTS[name]))


def heartbeat_seconds() -> float:
    return float(getattr(settings, "NODE_HEARTBEAT_SECONDS", 2.0))


def engine_log_dir() -> Path:
    return Path(settings.ENGINE_LOG_DIR)
