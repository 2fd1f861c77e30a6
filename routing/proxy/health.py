"""Per-process endpoint state: in-flight counts, the engine's live KV state, and a circuit breaker.

Passive ejection: `FAILURES_TO_EJECT` consecutive failures (connect errors, timeouts, 5xx) open the
breaker for a cooldown that doubles on each re-open (capped); after it the breaker half-opens and lets
exactly one probe request through; its success closes the breaker, its failure re-opens it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

FAILURES_TO_EJECT = 3
BASE_COOLDOWN_S = 2.0
MAX_COOLDOWN_S = 60.0
# Set from PROXY_LIVE_STALE_SECONDS when the proxy starts (2.5 agent telemetry periods by default): at 1 s,
# the agent's own period, a good share of samples were already "stale" when read (one period old, plus
# the sync and the poll), and best_fit fell back to in-flight counts for them.
STALE_AFTER_S = 2.5


@dataclass(slots=True)
class EndpointState:
    endpoint_id: str
    inflight: int = 0
    # Tokens this process sent to the endpoint since the engine's last live sample (not yet in its KV usage).
    pending_tokens: int = 0
    live_ts: float = 0.0
    kv_free_tokens: int | None = None
    kv_total_tokens: int | None = None
    consecutive_failures: int = 0
    open_until: float = 0.0
    cooldown_s: float = BASE_COOLDOWN_S
    probing: bool = False
    ejections: int = 0

    @property
    def state(self) -> str:
        if self.open_until == 0.0:
            return "closed"
        return "open" if time.monotonic() < self.open_until else "half_open"

    def available(self, now: float) -> bool:
        """Whether a request may go here now (closed, or half-open with no probe in flight)."""
        if self.open_until == 0.0:
            return True
        return now >= self.open_until and not self.probing

    def begin(self, now: float, tokens: int) -> None:
        self.inflight += 1
        self.pending_tokens += tokens
        if self.open_until and now >= self.open_until:
            self.probing = True

    def end(self) -> None:
        self.inflight -= 1

    def success(self) -> None:
        self.consecutive_failures = 0
        if self.open_until:
            self.open_until = 0.0
            self.cooldown_s = BASE_COOLDOWN_S
        self.probing = False

    def failure(self, now: float) -> bool:
        """Record a failure; True when this failure ejects the endpoint (opens the breaker)."""
        self.consecutive_failures += 1
        was_probe = self.probing
        self.probing = False
        if was_probe:
            self.cooldown_s = min(self.cooldown_s * 2, MAX_COOLDOWN_S)
            self.open_until = now + self.cooldown_s
            self.ejections += 1
            return True
        if self.open_until == 0.0 and self.consecutive_failures >= FAILURES_TO_EJECT:
            self.open_until = now + self.cooldown_s
            self.ejections += 1
            return True
        return False

    def update_live(self, ts: float, kv_usage: float | None, kv_total: int | None) -> None:
        if ts <= self.live_ts:
            return
        self.live_ts = ts
        self.pending_tokens = 0
        self.kv_total_tokens = kv_total
        if kv_total and kv_usage is not None:
            self.kv_free_tokens = int(kv_total * (1.0 - kv_usage))
        else:
            self.kv_free_tokens = None

    def kv_free_now(self, wall_now: float) -> int | None:
        """Free KV tokens net of pending dispatches; None when the sample is older than STALE_AFTER_S."""
        if self.kv_free_tokens is None or wall_now - self.live_ts > STALE_AFTER_S:
            return None
        return self.kv_free_tokens - self.pending_tokens
