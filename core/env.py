"""Small typed helpers that read settings from the environment.

Each helper fails loudly on a value it cannot parse, so a typo in a deployment's
environment stops the process at start instead of silently taking a default.
"""

from __future__ import annotations

import os
from pathlib import Path


class EnvError(ValueError):
    """An environment variable holds a value its helper cannot accept."""


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    lowered = raw.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise EnvError(f"{name}={raw!r}: expected true or false")


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise EnvError(f"{name}={raw!r}: expected an integer") from None


def env_limit(name: str, default: int | None) -> int | None:
    """A limit: a whole number of at least 0, or `none` (also `unlimited`) for no limit."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    if raw.strip().lower() in ("none", "unlimited"):
        return None
    try:
        value = int(raw)
    except ValueError:
        raise EnvError(f"{name}={raw!r}: expected a whole number or 'none'") from None
    if value < 0:
        raise EnvError(f"{name}={raw!r}: expected a whole number of at least 0, or 'none'")
    return value


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise EnvError(f"{name}={raw!r}: expected a number") from None


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return list(default)
    return [part.strip() for part in raw.split(",") if part.strip()]


def env_secret(name: str, default: str = "") -> str:
    """Read a secret from NAME, or from the file named by NAME_FILE (Docker/K8s secrets)."""
    file_name = os.environ.get(f"{name}_FILE")
    if file_name:
        return Path(file_name).read_text().strip()
    return os.environ.get(name, default)


def write_secret_file(path: Path, secret: str) -> None:
    """Write `secret` to `path`, readable by this user only, replacing any older file atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an older partial file may have kept other permissions
        os.write(fd, secret.encode() + b"\n")
    finally:
        os.close(fd)
    os.replace(partial, path)
