"""Webhook delivery: each owed message (AlertNotification) POSTed as Slack's {"text": ...}, with retries.

A message is due when it is pending and its next_attempt_at has come. Each is claimed with a row lock
(`SKIP LOCKED`), so two delivery runs never send one message twice; a failure (connection refused, a
timeout, a status other than 2xx) is kept with the attempt count, and the next try waits
ALERT_WEBHOOK_BACKOFF_SECONDS doubled per attempt, up to ALERT_WEBHOOK_BACKOFF_MAX_SECONDS; after
ALERT_WEBHOOK_MAX_ATTEMPTS the message is marked failed and left for the console to show. The URL is a
secret (a Slack webhook's path is its token): errors name the status or the exception, never the URL.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction

from alerts.choices import DeliveryStatus
from alerts.models import AlertNotification

log = logging.getLogger(__name__)


class DeliveryError(Exception):
    pass


def post_text(url: str, text: str, timeout: float) -> None:
    """POST {"text": text} as JSON; raise DeliveryError unless the receiver answers 2xx."""
    body = json.dumps({"text": text}).encode()
    req = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": "inferchain"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            response.read(1024)
    except urllib.error.HTTPError as exc:
        raise DeliveryError(f"the webhook answered {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise DeliveryError(f"the webhook could not be reached: {type(reason).__name__}: {reason}") from None


def backoff_seconds(attempts: int) -> float:
    """The wait after the `attempts`-th failure: base, 2 x base, 4 x base, ... up to the cap."""
    base = settings.ALERT_WEBHOOK_BACKOFF_SECONDS
    return float(min(base * 2 ** max(attempts - 1, 0), settings.ALERT_WEBHOOK_BACKOFF_MAX_SECONDS))


@dataclass
class DeliveryResult:
    sent: int = 0
    failed_attempts: int = 0
    gave_up: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"sent": self.sent, "failed_attempts": self.failed_attempts, "gave_up": self.gave_up}


def due_ids(now: dt.datetime) -> list[int]:
    return list(
        AlertNotification.objects.filter(status=DeliveryStatus.PENDING, next_attempt_at__lte=now)
        .order_by("next_attempt_at", "id")
        .values_list("pk", flat=True)[:100]
    )


def deliver_due(now: float | None = None) -> DeliveryResult:
    """Try every due message once, oldest first (at most 100 a run; the next run takes the rest)."""
    when = dt.datetime.fromtimestamp(time.time() if now is None else now, dt.UTC)
    result = DeliveryResult()
    url = settings.ALERT_WEBHOOK_URL
    if not url:
        return result
    for pk in due_ids(when):
        with transaction.atomic():
            row = (
                AlertNotification.objects.select_for_update(skip_locked=True)
                .filter(pk=pk, status=DeliveryStatus.PENDING, next_attempt_at__lte=when)
                .first()
            )
            if row is None:
                continue  # another run holds it, or it was sent meanwhile
            row.attempts += 1
            try:
                post_text(url, row.text, settings.ALERT_WEBHOOK_TIMEOUT_SECONDS)
            except DeliveryError as exc:
                row.last_error = str(exc)[:500]
                if row.attempts >= settings.ALERT_WEBHOOK_MAX_ATTEMPTS:
                    row.status = DeliveryStatus.FAILED
                    result.gave_up += 1
                    log.warning("alert message %s not delivered after %s attempts: %s", pk, row.attempts, exc)
                else:
                    row.next_attempt_at = when + dt.timedelta(seconds=backoff_seconds(row.attempts))
                    result.failed_attempts += 1
            else:
                row.status = DeliveryStatus.SENT
                row.sent_at = when
                row.last_error = ""
                result.sent += 1
            row.save(update_fields=["attempts", "status", "next_attempt_at", "last_error", "sent_at"])
    return result
