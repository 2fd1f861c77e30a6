"""What every endpoint family shares: the server's state (configuration, engine cores, serving limits,
counters), JSON responses and the request-body parsing that answers vLLM's refusals."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import re
import time
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import REGISTRY

from vllm_sim import text
from vllm_sim.engine import SimEngine
from vllm_sim.metrics import EngineMetrics
from vllm_sim.profiles import EngineShape
from vllm_sim.protocol import ApiError, ServingLimits, body_error


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def _error(err: ApiError) -> web.Response:
    return _json(err.body(), err.status)


JSON_ONLY = "Unsupported Media Type: Only 'application/json' is allowed"


def _json_subtype(content_type: str) -> bool:
    main, _, sub = content_type.split(";", maxsplit=1)[0].strip().lower().partition("/")
    return main == "application" and (sub == "json" or sub.endswith("+json"))


# An integer of 19 or more digits: orjson reads one outside int64 (2**64 and up, or below -2**63) as a
# float, and -2**63 - 1 rounds back to -2**63, inside the seed's range. vLLM's FastAPI reads the body
# with the standard library's json, whose integers are exact, so pydantic refuses it.
_LONG_INTEGER = re.compile(rb"\d{19}")


def _parse_json(raw: bytes) -> Any:
    try:
        if _LONG_INTEGER.search(raw):
            with contextlib.suppress(UnicodeDecodeError):  # (orjson below says where the bytes are bad)
                return json.loads(raw.decode())  # exact integers, as vLLM reads them
        return orjson.loads(raw)
    except (orjson.JSONDecodeError, json.JSONDecodeError) as exc:
        # FastAPI reports the position of the decode error in `loc`.
        raise body_error(
            "json_invalid", str(exc.pos), "JSON decode error", {}, ctx={"error": exc.msg}
        ) from None


class ServerState:
    """The state of one simulated `vllm serve` process, read by every endpoint family's handlers."""

    def __init__(self, args: argparse.Namespace, shape: EngineShape) -> None:
        self.args = args
        self.shape = shape
        self.served_names: list[str] = args.served_model_name or [args.model]
        self.api_keys: list[str] = args.api_key or []
        self.enable_prefix_caching = args.enable_prefix_caching is not False
        # One engine core per data-parallel rank (-dp N), each with its own KV cache and its own
        # `engine="i"` metric series; requests go to the least-loaded one (DPLBAsyncMPClient).
        self.engines = [
            SimEngine(
                shape,
                EngineMetrics(
                    shape,
                    self.served_names[0],
                    self.enable_prefix_caching,
                    REGISTRY,
                    user_specified_block_size=args.block_size is not None,
                    engine_index=i,
                ),
                enable_prefix_caching=self.enable_prefix_caching,
                time_scale=args.sim_time_scale,
            )
            for i in range(max(1, args.data_parallel_size))
        ]
        self.engine = self.engines[0]
        self.metrics = self.engine.metrics
        self.limits = ServingLimits(
            served_names=self.served_names,
            max_model_len=shape.max_model_len,
            max_logprobs=args.max_logprobs,
            force_include_usage=bool(args.enable_force_include_usage),
            tokenizer=text.load_prompt_tokenizer(args.tokenizer, args.model),
            return_tokens_as_token_ids=bool(args.return_tokens_as_token_ids),
            auto_tools=bool(args.enable_auto_tool_choice) and bool(args.tool_call_parser),
            # The served model's own vocabulary, not Llama-3's whatever the model: a flag, its
            # config.json, else the profile's (each profile's model has its vocabulary).
            vocab_size=args.sim_vocab_size
            or text.config_vocab_size(args.model)
            or shape.profile.model.vocab_size,
        )
        self.dev_mode = os.environ.get("VLLM_SERVER_DEV_MODE", "0") == "1"
        self.load_tracking = bool(args.enable_server_load_tracking)
        self.created = int(time.time())
        self.request_count = 0
        self.in_flight = 0
        self.error_rng = random.Random(args.seed)
        self.ready = False
        self._key_digests = [hashlib.sha256(k.encode()).digest() for k in self.api_keys]

    async def _body(self, request: web.Request) -> Any:
        raw = await request.read()
        content_type = request.headers.get("Content-Type", "")
        if content_type.lower().split(";", maxsplit=1)[0] != "application/json":
            # vLLM's validate_json_request dependency refuses every other media type (no Content-Type
            # too), after FastAPI has decoded bodies it reads as JSON: none, or application/*+json.
            if not content_type or _json_subtype(content_type):
                _parse_json(raw)
            raise ApiError(400, "Bad Request", f"1 validation error:\n  {JSON_ONLY}")
        return _parse_json(raw)
