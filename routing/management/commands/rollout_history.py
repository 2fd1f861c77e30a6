"""`manage.py rollout_history ID [--json]`: print one rollout's decisions with their numbers."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from routing.models import Rollout
from routing.rollouts.history import format_history


class Command(BaseCommand):
    help = "Print a canary rollout's decision history (what, when, by whom, why, and the gate numbers)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("rollout_id", type=int)
        parser.add_argument(
            "--json", dest="as_json", action="store_true", help="every decision's full numbers as JSON"
        )

    def handle(self, *args: Any, rollout_id: int, as_json: bool = False, **options: Any) -> None:
        rollout = (
            Rollout.objects.select_related("alias", "baseline_version__model", "candidate_version__model")
            .filter(pk=rollout_id)
            .first()
        )
        if rollout is None:
            raise CommandError(f"No rollout with id {rollout_id}.")
        if as_json:
            self.stdout.write(_dump(rollout))
        else:
            self.stdout.write(format_history(rollout), ending="")


def _dump(rollout: Rollout) -> str:
    decisions = [
        {
            "created_at": d.created_at.isoformat(),
            "action": d.action,
            "from_share": d.from_share,
            "to_share": d.to_share,
            "actor": d.actor.get_username() if d.actor else None,
            "reason": d.reason,
            "numbers": d.numbers,
        }
        for d in rollout.decisions.select_related("actor").order_by("created_at", "id")
    ]
    return json.dumps({"rollout": rollout.pk, "alias": rollout.alias.name, "decisions": decisions}, indent=2)
