"""GET /api/routing/predictions/: each pool's engines, predicted vs observed TTFT and time per output
token and the predictors' error (routing/predictions.py)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from routing.api.serializers import PoolPredictionsSerializer
from routing.predictions import predictions_by_pool


@extend_schema(responses={200: PoolPredictionsSerializer(many=True)})
@api_view(["GET"])
def predictions(request: Request) -> Response:
    """Per pool, each ready engine's latency predictor as the proxies last published it."""
    return Response(PoolPredictionsSerializer(predictions_by_pool(), many=True).data)
