"""What serves an alias (routing.serving), for every console page that shows it: the list of every
alias, and one alias by name. Everyone signed in reads."""

from __future__ import annotations

from django.http import Http404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.decorators import api_view
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from routing import serving as domain

MINUTES = OpenApiParameter(
    "minutes",
    int,
    description=f"The live share's window, 1 to {domain.MAX_WINDOW_MINUTES} minutes "
    f"(default {domain.SERVING_WINDOW_MINUTES}).",
)


class VersionServingSerializer(serializers.Serializer):
    """One version's part in serving an alias: configured, engines, live."""

    version_id = serializers.IntegerField()
    version_label = serializers.CharField(help_text='"model@revision".')
    role = serializers.ChoiceField(
        choices=list(domain.ROLES),
        help_text="active: the alias's active version; candidate: the active rollout's; pinned: a pool names "
        "it; shadow: only mirrored to; idle: engines but no route; retired: answered in the window, "
        "serves no longer.",
    )
    configured_share = serializers.FloatField(
        allow_null=True,
        help_text="Percent of the alias's requests the routing sends it (pools, policy, canary share); null "
        "when policy rules decide per request (see routes). Overflow (fallback, spill) is not counted.",
    )
    routes = serializers.ListField(
        child=serializers.CharField(),
        help_text="How requests reach it, e.g. 'pool llama-fast: rule 2 (...)'.",
    )
    engines_ready = serializers.IntegerField(
        help_text="Ready deployments under the alias's name: routed now."
    )
    engines_sleeping = serializers.IntegerField()
    engines_total = serializers.IntegerField(help_text="Deployments that should run (desired running).")
    requests = serializers.IntegerField(help_text="Requests sent to its engines in the window (request log).")
    live_share = serializers.FloatField(
        allow_null=True, help_text="Percent of the alias's requests in the window; null when there were none."
    )
    mirrored_percent = serializers.FloatField(
        allow_null=True, help_text="Percent of requests mirrored to it by shadow traffic; null when none."
    )


class AliasServingSerializer(serializers.Serializer):
    """Which versions serve an alias, configured and live (from the request log), with the totals."""

    alias = serializers.IntegerField()
    alias_name = serializers.CharField()
    active_version = serializers.IntegerField()
    active_version_label = serializers.CharField()
    configured_mode = serializers.ChoiceField(
        choices=[domain.FIXED, domain.RULES, domain.UNROUTED],
        help_text="fixed: every route ends at one version (a canary aside), shares are numbers; rules: "
        "policy rules send requests to pools of different versions; none: no pool routes the alias.",
    )
    rollout = serializers.IntegerField(allow_null=True, help_text="The active rollout, if any.")
    rollout_state = serializers.CharField(allow_blank=True)
    rollout_share = serializers.FloatField(allow_null=True, help_text="The active rollout's canary share.")
    window_minutes = serializers.IntegerField(help_text="The live share's window.")
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()
    versions = VersionServingSerializer(many=True)
    engines_ready = serializers.IntegerField()
    engines_sleeping = serializers.IntegerField()
    engines_total = serializers.IntegerField()
    requests = serializers.IntegerField(help_text="The alias's requests sent to an engine in the window.")


def _minutes(request: Request) -> int:
    raw = request.query_params.get("minutes", str(domain.SERVING_WINDOW_MINUTES))
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= domain.MAX_WINDOW_MINUTES:
        raise ValidationError({"minutes": [f"Must be an integer from 1 to {domain.MAX_WINDOW_MINUTES}."]})
    return int(raw)


@extend_schema(parameters=[MINUTES], responses={200: AliasServingSerializer(many=True)})
@api_view(["GET"])
def serving(request: Request) -> Response:
    """Per alias, which versions serve it: configured share, engines ready of total, and the live share
    of its requests over the last `minutes` (default 15) from the request log."""
    rows = domain.alias_serving(minutes=_minutes(request))
    return Response(AliasServingSerializer(rows, many=True).data)


@extend_schema(parameters=[MINUTES], responses={200: AliasServingSerializer})
@api_view(["GET"])
def alias_serving(request: Request, name: str) -> Response:
    """Which versions serve one alias (by name): configured share, engines ready of total, live share."""
    row = domain.serving_of(name, minutes=_minutes(request))
    if row is None:
        raise Http404(f"No alias named {name!r}.")
    return Response(AliasServingSerializer(row).data)
