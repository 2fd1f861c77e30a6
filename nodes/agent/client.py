"""The agent's client for the control plane's agent channel (/api/agent/): JSON over HTTP, with the
host's token as a bearer credential, a timeout on every call and capped exponential backoff between
failed ones. Standard library only: the agent imports nothing of Django.
"""

from __future__ import annotations

import json
import os
import random
import stat
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

TOKEN_ENV = "INFERCHAIN_AGENT_TOKEN"
TOKEN_FILE_ENV = "INFERCHAIN_AGENT_TOKEN_FILE"
CONTROL_PLANE_ENV = "INFERCHAIN_CONTROL_PLANE"


class ControlPlaneUnavailable(Exception):
    """The control plane did not answer (down, unreachable, timed out, or a server error)."""


class AgentRefused(Exception):
    """The control plane refused the agent's token (wrong, revoked, another host's): a person must act."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        error = body.get("error", {}) if isinstance(body.get("error"), dict) else {}
        super().__init__(f"{status} {error.get('code', '')}: {error.get('message', body)}")
        self.status = status
        self.code = str(error.get("code", ""))


def read_token(token_file: str | None) -> str:
    """The host's agent token: from a file readable by its owner only, or from INFERCHAIN_AGENT_TOKEN.

    Never from the command line, where every user of the machine can read it in the process list.
    """
    path = token_file or os.environ.get(TOKEN_FILE_ENV)
    if path:
        mode = Path(path).stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise SystemExit(f"{path} is readable by other users; chmod 600 it (it holds the agent token).")
        return Path(path).read_text().strip()
    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise SystemExit(f"No agent token: set {TOKEN_ENV} or {TOKEN_FILE_ENV} (a file with mode 0600).")
    return token


class ControlPlane:
    """Calls of one agent; `ready_for_call` and `failed` implement the backoff between failed calls."""

    def __init__(
        self, base_url: str, host_name: str, token: str, *, timeout: float = 5.0, max_backoff: float = 10.0
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.host_name = host_name
        self._token = token
        self.timeout = timeout
        self.max_backoff = max_backoff
        self.failures = 0
        self.next_call_at = 0.0
        self.answered_once = False

    def ready_for_call(self) -> bool:
        return time.monotonic() >= self.next_call_at

    def _failed(self) -> None:
        self.failures += 1
        # Until the first answer (the control plane may still be starting) retry at least once a second.
        cap = self.max_backoff if self.answered_once else 1.0
        delay = min(cap, 0.5 * 2 ** min(self.failures - 1, 10))
        self.next_call_at = time.monotonic() + delay * random.uniform(0.8, 1.2)

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST JSON; the decoded answer. Raises ControlPlaneUnavailable or AgentRefused."""
        request = urllib.request.Request(
            f"{self.base_url}{path}",
            data=json.dumps(body).encode(),
            method="POST",
            headers={
                "Content-Type": "application/json",
                "Authorization": f"Bearer {self._token}",
                "X-Agent-Host": self.host_name,
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                answer = json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            try:
                detail = json.loads(exc.read() or b"{}")
            except ValueError:
                detail = {}
            self._failed()
            if exc.code in (401, 403):
                raise AgentRefused(exc.code, detail if isinstance(detail, dict) else {}) from None
            raise ControlPlaneUnavailable(f"{path} answered {exc.code}: {detail}") from None
        except (OSError, ValueError) as exc:  # URLError, timeouts, refused connections, bad JSON
            self._failed()
            raise ControlPlaneUnavailable(f"{path}: {exc}") from None
        self.failures = 0
        self.next_call_at = 0.0
        self.answered_once = True
        return answer if isinstance(answer, dict) else {}
