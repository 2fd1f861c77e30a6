"""The HTTP side of the simulator: vLLM's OpenAI-compatible surface on aiohttp, in front of SimEngine."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import hashlib
import hmac
import json
import logging
import os
import random
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, disable_created_metrics, generate_latest

from vllm_sim import asgi_filter, logprobs, model, ray_cluster, text
from vllm_sim.engine import Sequence, SimEngine
from vllm_sim.gpu import gpu_snapshot
from vllm_sim.metrics import EngineMetrics
from vllm_sim.profiles import PROFILES, EngineConfigError, EngineShape, derive_engine_shape, wake_time_s
from vllm_sim.protocol import (
    ApiError,
    SamplingRequest,
    ServingLimits,
    body_error,
    engine_checks,
    messages_text,
    parse_batch_chat,
    parse_chat,
    parse_completion,
)

logger = logging.getLogger("vllm_sim")

GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")
# QuantizationMethods in the order vLLM prints them (model_executor/layers/quantization/__init__.py:12-43,
# as listed in tests/data/vllm/serve-flags.md).
QUANTIZATION_METHODS_ORDER = (
    "awq", "auto_awq", "fp8", "fbgemm_fp8", "fp_quant", "modelopt", "modelopt_fp4", "modelopt_mxfp8",
    "modelopt_mixed", "auto_gptq", "gptq", "gptq_marlin", "awq_marlin", "humming", "compressed-tensors",
    "experts_int8", "quark", "moe_wna16", "torchao", "inc", "mxfp4", "gpt_oss_mxfp4", "deepseek_v4_fp8",
    "online", "fp8_per_tensor", "fp8_per_block", "fp8_per_channel", "int8_per_channel_weight_only",
    "nvfp4_per_token", "mxfp8",
)  # fmt: skip
QUANTIZATION_METHODS = frozenset(QUANTIZATION_METHODS_ORDER)
# EngineDeadError's message (vllm/v1/engine/exceptions.py).
ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."
VERSION = "0.28.0.dev0+sim"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def _error(err: ApiError) -> web.Response:
    return _json(err.body(), err.status)


JSON_ONLY = "Unsupported Media Type: Only 'application/json' is allowed"


def _json_subtype(content_type: str) -> bool:
    main, _, sub = content_type.split(";", maxsplit=1)[0].strip().lower().partition("/")
    return main == "application" and (sub == "json" or sub.endswith("+json"))


def _parse_json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        # FastAPI reports the position of the decode error in `loc`.
        raise body_error(
            "json_invalid", str(exc.pos), "JSON decode error", {}, ctx={"error": exc.msg}
        ) from None


def build_shape(args: argparse.Namespace) -> EngineShape:
    """The engine shape from the CLI; max_model_len -1/auto fits the model into the KV cache."""
    profile = PROFILES[args.sim_profile]
    kwargs: dict[str, Any] = {
        "tensor_parallel_size": args.tensor_parallel_size,
        "pipeline_parallel_size": args.pipeline_parallel_size,
        "block_size": args.block_size or 16,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "kv_cache_dtype": args.kv_cache_dtype,
        "num_gpu_blocks_override": args.num_gpu_blocks_override,
    }
    if args.max_model_len == -1:
        probe = derive_engine_shape(profile, max_model_len=args.block_size or 16, **kwargs)
        fit = min(profile.model.max_position_embeddings, probe.kv_cache_size_tokens)
        return derive_engine_shape(profile, max_model_len=fit, **kwargs)
    return derive_engine_shape(profile, max_model_len=args.max_model_len, **kwargs)


class SimServer:
    """One simulated `vllm serve` process: configuration, engine, fault knobs and HTTP handlers."""

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
        )
        self.dev_mode = os.environ.get("VLLM_SERVER_DEV_MODE", "0") == "1"
        self.load_tracking = bool(args.enable_server_load_tracking)
        self.created = int(time.time())
        self.request_count = 0
        self.in_flight = 0
        self.error_rng = random.Random(args.seed)
        self.ready = False
        self._key_digests = [hashlib.sha256(k.encode()).digest() for k in self.api_keys]

    # app ---------------------------------------------------------------------------------------------

    def build_app(self) -> web.Application:
        # vLLM adds --middleware classes outside its own auth middleware, so they see every request first.
        extra = [asgi_filter.asgi_filter(asgi_filter.load(path)) for path in self.args.middleware or []]
        app = web.Application(
            middlewares=[*extra, self._errors_mw, self._auth_mw], client_max_size=64 * 1024**2
        )
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/ping", self.health)
        r.add_post("/ping", self.health)
        r.add_get("/version", self.version)
        r.add_get("/load", self.load)
        r.add_get("/metrics", self.metrics_endpoint)
        r.add_get("/v1/models", self.models)
        r.add_post("/tokenize", self.tokenize)
        r.add_post("/detokenize", self.detokenize)
        r.add_post("/v1/chat/completions", self.chat_completions)
        r.add_post("/v1/chat/completions/batch", self.batch_chat_completions)
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/responses", self.responses)
        # SageMaker's dispatcher (sagemaker/api_router.py:54-96): not under /v1, so never key-guarded.
        r.add_post("/invocations", self.invocations)
        # Also served by vLLM for generate models and not key-guarded (tests/data/vllm/endpoints.md).
        r.add_post("/generative_scoring", self.generative_scoring)
        r.add_post("/scale_elastic_ep", self.scale_elastic_ep)
        r.add_post("/is_scaling_elastic_ep", self.is_scaling_elastic_ep)
        if self.args.enable_tokenizer_info_endpoint:
            r.add_get("/tokenizer_info", self.tokenizer_info)
        if not self.args.disable_fastapi_docs:
            # FastAPI's defaults (launchers/app.py:34-41), dropped by --disable-fastapi-docs.
            r.add_get("/openapi.json", self.openapi)
            r.add_get("/docs", self.docs_page)
            r.add_get("/redoc", self.docs_page)
        if self.dev_mode:
            # routers.py:34-37: only with VLLM_SERVER_DEV_MODE=1; none of these are under /v1.
            r.add_post("/sleep", self.sleep)
            r.add_post("/wake_up", self.wake_up)
            r.add_get("/is_sleeping", self.is_sleeping)
            r.add_post("/reset_prefix_cache", self.reset_prefix_cache)
            r.add_get("/server_info", self.server_info)
        r.add_get("/sim/gpu", self.sim_gpu)
        r.add_get("/sim/stats", self.sim_stats)
        return app

    @web.middleware
    async def _auth_mw(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        # vLLM's AuthenticationMiddleware: a path-prefix check, Bearer scheme case-insensitive,
        # keys compared by SHA-256 in constant time, compact {"error":"Unauthorized"} body.
        if self.api_keys and request.method != "OPTIONS" and request.path.startswith(GUARDED_PREFIXES):
            header = request.headers.get("Authorization", "")
            scheme, _, token = header.partition(" ")
            ok = False
            if scheme.lower() == "bearer":
                digest = hashlib.sha256(token.encode()).digest()
                for d in self._key_digests:
                    ok |= hmac.compare_digest(digest, d)
            if not ok:
                return web.Response(
                    body=b'{"error":"Unauthorized"}', status=401, content_type="application/json"
                )
        return await handler(request)

    @web.middleware
    async def _errors_mw(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as err:
            return _error(err)
        except web.HTTPNotFound:
            return _json({"detail": "Not Found"}, 404)
        except web.HTTPMethodNotAllowed:
            return _json({"detail": "Method Not Allowed"}, 405)

    # simple endpoints --------------------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        # instrumentator/health.py:22-33: 503 once the engine core is dead (EngineDeadError).
        return web.Response(status=503 if any(e.dead for e in self.engines) else 200)

    async def version(self, request: web.Request) -> web.Response:
        return _json({"version": VERSION})

    async def load(self, request: web.Request) -> web.Response:
        # basic.py:30-50: the counter moves only with --enable-server-load-tracking; otherwise 0.
        return _json({"server_load": self.in_flight if self.load_tracking else 0})

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        for e in self.engines:
            e._update_gauges()
        return web.Response(body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def models(self, request: web.Request) -> web.Response:
        data = []
        for name in self.served_names:
            data.append(
                {
                    "id": name,
                    "object": "model",
                    "created": self.created,
                    "owned_by": "vllm",
                    "root": self.args.model,
                    "parent": None,
                    "max_model_len": self.shape.max_model_len,
                    "permission": [
                        {
                            "id": f"modelperm-{uuid.uuid4().hex}",
                            "object": "model_permission",
                            "created": self.created,
                            "allow_create_engine": False,
                            "allow_sampling": True,
                            "allow_logprobs": True,
                            "allow_search_indices": False,
                            "allow_view": True,
                            "allow_fine_tuning": False,
                            "organization": "*",
                            "group": None,
                            "is_blocking": False,
                        }
                    ],
                }
            )
        return _json({"object": "list", "data": data})

    # endpoints vLLM registers besides the generation ones ---------------------------------------------

    async def tokenizer_info(self, request: web.Request) -> web.Response:
        # tokenize/api_router.py:86-99 (only with --enable-tokenizer-info-endpoint): TokenizerInfo
        # (tokenize/serving.py:163-184) answers the tokenizer's init kwargs (its tokenizer_config.json, file
        # paths removed) plus `tokenizer_class`, and `chat_template` only when --chat-template was given.
        # The simulator reports the few keys of a Llama-3 tokenizer config that its tokenizer models.
        info: dict[str, Any] = {
            "bos_token": text.BOS,
            "eos_token": "<|eot_id|>",
            "model_max_length": self.shape.profile.model.max_position_embeddings,
            "tokenizer_class": "PreTrainedTokenizerFast",
        }
        return _json(info)

    def _routes(self, request: web.Request) -> list[tuple[str, str]]:
        out = []
        for route in request.app.router.routes():
            info = route.resource.get_info() if route.resource is not None else {}
            path = info.get("path") or info.get("formatter")
            if path and not path.startswith("/sim/") and route.method != "HEAD":
                out.append((path, route.method.lower()))
        return out

    async def openapi(self, request: web.Request) -> web.Response:
        """FastAPI's /openapi.json, reduced to what a client discovers with it: the registered paths."""
        paths: dict[str, dict[str, Any]] = {}
        for path, method in self._routes(request):
            ok = {"responses": {"200": {"description": "Successful Response"}}}
            paths.setdefault(path, {})[method] = ok
        return _json({"openapi": "3.1.0", "info": {"title": "FastAPI", "version": "0.1.0"}, "paths": paths})

    async def docs_page(self, request: web.Request) -> web.Response:
        page = (
            "<!DOCTYPE html><html><head><title>FastAPI - Swagger UI</title></head><body>"
            '<div id="swagger-ui"></div><p>OpenAPI document: <a href="/openapi.json">/openapi.json</a></p>'
            "</body></html>"
        )
        return web.Response(text=page, content_type="text/html")

    async def invocations(self, request: web.Request) -> web.StreamResponse:
        """SageMaker's dispatcher: the first request schema the body fits (chat, then completion)."""
        body = await self._body(request)
        if isinstance(body, dict) and "messages" in body:
            return await self._generate(request, parse_chat(body, self.limits), chat=True)
        if isinstance(body, dict) and "prompt" in body:
            return await self._generate(request, parse_completion(body, self.limits), chat=False)
        raise ApiError(
            400,
            "BadRequestError",
            "Cannot find suitable handler for request. Expected one of: "
            "['ChatCompletionRequest', 'CompletionRequest']",
        )

    async def generative_scoring(self, request: web.Request) -> web.Response:
        # generative_scoring/api_router.py:29-30: served, unguarded; the simulator has no scores to give.
        await self._body(request)
        raise ApiError(501, "NotImplementedError", "The simulator does not implement generative scoring.")

    async def scale_elastic_ep(self, request: web.Request) -> web.Response:
        # elastic_ep/api_router.py:29: an engine without elastic expert parallelism refuses to scale.
        await self._body(request)
        raise ApiError(400, "BadRequestError", "Elastic expert parallelism is not enabled on this engine.")

    async def is_scaling_elastic_ep(self, request: web.Request) -> web.Response:
        return _json({"is_scaling_elastic_ep": False})

    # dev endpoints (VLLM_SERVER_DEV_MODE=1) ------------------------------------------------------------

    async def sleep(self, request: web.Request) -> web.Response:
        # dev/sleep/api_router.py:21-29: level (default "1") and mode (default "abort"); empty 200.
        # A level that is no integer fails in int() there: a 500, as here.
        level = int(request.query.get("level", "1"))
        mode = request.query.get("mode", "abort")
        for e in self.engines:
            e.sleep(level, abort=mode == "abort")
            e.metrics.set_sleep_state(level)
        return web.Response(status=200)

    async def wake_up(self, request: web.Request) -> web.Response:
        # sleep/api_router.py:32-42: repeated `tags`; none wakes everything. The answer comes once the
        # memory is back, after the modelled copy time (profiles.wake_time_s).
        tags = request.query.getall("tags", None)
        delay = 0.0
        for e in self.engines:
            if self.args.enable_sleep_mode:
                delay = max(delay, wake_time_s(e.shape, e.sleep_level, e.waking(tags)))
        if delay > 0:
            await asyncio.sleep(delay / self.args.sim_time_scale)
        for e in self.engines:
            e.wake_up(tags)
            if not e.sleeping:
                e.metrics.set_sleep_state(0)
        return web.Response(status=200)

    async def is_sleeping(self, request: web.Request) -> web.Response:
        return _json({"is_sleeping": self.engine.sleeping})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        for e in self.engines:
            e.pool.reset_cache()
        return web.Response(status=200)

    async def server_info(self, request: web.Request) -> web.Response:
        return _json({"vllm_config": {"model": self.args.model, "max_model_len": self.shape.max_model_len}})

    async def sim_gpu(self, request: web.Request) -> web.Response:
        seed = self.args.sim_gpu_uuid_seed or str(self.args.port)
        # Data-parallel rank i runs on GPUs first + i*W .. first + (i+1)*W - 1, W = TP x PP.
        world = self.shape.world_size
        gpus: list[dict[str, Any]] = []
        for i, e in enumerate(self.engines):
            first = self.args.sim_gpu_index + i * world
            gpus.extend(
                gpu_snapshot(
                    e,
                    first_index=first,
                    uuid_seed=seed,
                    ready=self.ready,
                    sleep_mode=bool(self.args.enable_sleep_mode),
                )["gpus"]
            )
        return _json({"simulated": True, "profile": self.shape.profile.name, "gpus": gpus})

    async def sim_stats(self, request: web.Request) -> web.Response:
        es = self.engines
        return _json(
            {
                "simulated": True,
                "profile": self.shape.profile.name,
                "time_scale": self.engine.time_scale,
                "data_parallel_size": len(es),
                # Per engine core; the totals below add them up.
                "num_gpu_blocks": self.shape.num_gpu_blocks,
                "block_size": self.shape.block_size,
                "free_blocks": sum(e.pool.num_free for e in es),
                "max_num_seqs": self.shape.max_num_seqs,
                "max_num_batched_tokens": self.shape.max_num_batched_tokens,
                "max_model_len": self.shape.max_model_len,
                "running": sum(len(e.running) for e in es),
                "waiting": sum(len(e.waiting) for e in es),
                "running_per_engine": [len(e.running) for e in es],
                "steps": sum(e.total_steps for e in es),
                "preemptions": sum(e.num_preemptions for e in es),
                "busy_model_s": round(sum(e.busy_model_s for e in es), 6),
                "lost_wall_s": round(max(e.lost_wall_s for e in es), 6),
                "requests": self.request_count,
                "hung": any(e.hung for e in es),
            }
        )

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

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        if not isinstance(body, dict):
            raise body_error(
                "model_attributes_type", "", "Input should be a valid dictionary or object", body
            )
        if body.get("model") is not None and body["model"] not in self.served_names:
            raise ApiError(404, "NotFoundError", f"The model `{body['model']}` does not exist.", "model")
        tok = self.limits.tokenizer
        if "messages" in body:
            messages, add_gen = messages_text(body)
            rendered = text.render_chat(messages, add_gen)
            ids = tok.encode_rendered(rendered)
            strs = tok.pieces(rendered, add_special_tokens=False) if body.get("return_token_strs") else None
        elif isinstance(body.get("prompt"), str):
            special = bool(body.get("add_special_tokens", True))
            ids = tok.encode_prompt(body["prompt"], add_special_tokens=special)
            strs = (
                tok.pieces(body["prompt"], add_special_tokens=special)
                if body.get("return_token_strs")
                else None
            )
        else:
            raise body_error("missing", "prompt", "Field required", body)
        return _json(
            {"count": len(ids), "max_model_len": self.shape.max_model_len, "tokens": ids, "token_strs": strs}
        )

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        tokens = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise body_error("list_type", "tokens", "Input should be a valid list", tokens)
        return _json({"prompt": self.limits.tokenizer.decode(tokens)})

    # generation --------------------------------------------------------------------------------------

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        req = parse_chat(await self._body(request), self.limits)
        return await self._generate(request, req, chat=True)

    async def batch_chat_completions(self, request: web.Request) -> web.Response:
        """POST /v1/chat/completions/batch (chat_completion/api_router.py:77-102): `messages` is a list of
        conversations, each run as its own request; one choice per conversation, indexed in order, usage
        summed (chat_completion/batch_serving.py:104-332). Not streamed; n must be 1."""
        body = await self._body(request)
        if not isinstance(body, dict):
            raise body_error(
                "model_attributes_type", "", "Input should be a valid dictionary or object", body
            )
        convs = parse_batch_chat(body)
        # to_chat_completion_request (protocol.py:1158-1164): the shared fields plus one conversation;
        # `stream` is not a field of the batch request, so each sub-request is non-streaming.
        shared = {k: v for k, v in body.items() if k not in ("messages", "stream", "stream_options")}
        reqs = [parse_chat({**shared, "messages": conv}, self.limits) for conv in convs]
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(self._collect(req, request)) for req in reqs]
        except* ApiError as errors:
            # The first refusal answers the batch (the other conversations are cancelled).
            raise errors.exceptions[0] from None
        results = [t.result() for t in tasks]
        rid = "chatcmpl-" + uuid.uuid4().hex
        choices = []
        prompt_tokens = completion_tokens = 0
        for i, (req, seqs, conv) in enumerate(zip(reqs, results, convs, strict=True)):
            if body.get("echo"):
                # The batch path echoes the last message whatever its role (batch_serving.py:288-297).
                last = conv[-1].get("content") if isinstance(conv[-1], dict) else None
                req.chat_echo = text.content_text(last) if isinstance(last, list) else (last or "")
            choice = self._full_response(req, seqs, rid, chat=True)["choices"][0]
            choice["index"] = i
            choices.append(choice)
            prompt_tokens += len(seqs[0].prompt_ids)
            completion_tokens += len(seqs[0].out)
        return _json(
            {
                "id": rid,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": reqs[0].model,
                "choices": choices,
                "service_tier": None,
                "system_fingerprint": None,
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                    "completion_tokens": completion_tokens,
                    "prompt_tokens_details": None,
                },
                "prompt_logprobs": None,
                "prompt_token_ids": None,
                "kv_transfer_params": None,
            }
        )

    async def completions(self, request: web.Request) -> web.StreamResponse:
        req = parse_completion(await self._body(request), self.limits)
        return await self._generate(request, req, chat=False)

    async def responses(self, request: web.Request) -> web.Response:
        """A minimal OpenAI Responses API (responses/api_router.py:48): text input or messages,
        `instructions`, `max_output_tokens`; answered in the Response object's shape, not streamed."""
        body = await self._body(request)
        if not isinstance(body, dict):
            raise body_error(
                "model_attributes_type", "", "Input should be a valid dictionary or object", body
            )
        if "input" not in body:
            raise body_error("missing", "input", "Field required", body)
        if body.get("stream"):
            raise ApiError(
                501, "NotImplementedError", "The simulator's /v1/responses does not stream (stream=false)."
            )
        messages: list[dict[str, Any]] = []
        if body.get("instructions"):
            messages.append({"role": "system", "content": body["instructions"]})
        raw = body["input"]
        if isinstance(raw, str):
            messages.append({"role": "user", "content": raw})
        elif isinstance(raw, list):
            for item in raw:
                content = item.get("content") if isinstance(item, dict) else None
                if isinstance(content, list):
                    content = "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
                if not isinstance(item, dict) or not isinstance(content, str):
                    raise body_error("string_type", "input", "Input should be a valid string", item)
                messages.append({"role": item.get("role", "user"), "content": content})
        else:
            raise body_error("string_type", "input", "Input should be a valid string", raw)
        chat_body: dict[str, Any] = {"messages": messages}
        for key in ("model", "temperature", "top_p", "seed"):
            if body.get(key) is not None:
                chat_body[key] = body[key]
        if body.get("max_output_tokens") is not None:
            chat_body["max_completion_tokens"] = body["max_output_tokens"]
        req = parse_chat(chat_body, self.limits)
        seqs = await self._collect(req)
        s = seqs[0]
        usage = self._usage(req, seqs)
        complete = s.finish_reason != "length"
        return _json(
            {
                "id": "resp_" + uuid.uuid4().hex,
                "created_at": int(time.time()),
                "incomplete_details": None if complete else {"reason": "max_output_tokens"},
                "instructions": body.get("instructions"),
                "metadata": body.get("metadata"),
                "model": req.model,
                "object": "response",
                "output": [
                    {
                        "id": "msg_" + uuid.uuid4().hex,
                        "content": [
                            {
                                "annotations": [],
                                "text": self._text(s, 0, len(s.out)),
                                "type": "output_text",
                                "logprobs": None,
                            }
                        ],
                        "role": "assistant",
                        "status": "completed" if complete else "incomplete",
                        "type": "message",
                    }
                ],
                "parallel_tool_calls": True,
                "temperature": req.temperature,
                "tool_choice": "auto",
                "tools": [],
                "top_p": body.get("top_p", 1.0),
                "background": False,
                "max_output_tokens": req.max_tokens,
                "previous_response_id": None,
                "reasoning": None,
                "service_tier": "auto",
                "status": "completed" if complete else "incomplete",
                "text": None,
                "truncation": "disabled",
                "usage": {
                    "input_tokens": usage["prompt_tokens"],
                    "input_tokens_details": {"cached_tokens": s.num_cached_prompt_tokens},
                    "output_tokens": usage["completion_tokens"],
                    "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": usage["total_tokens"],
                },
                "user": None,
            }
        )

    async def _collect(self, req: SamplingRequest, request: web.Request | None = None) -> list[Sequence]:
        """Run a validated request to completion (non-streaming paths)."""
        self._faults()
        engine_checks(req, self.limits)
        event = asyncio.Event()
        seqs = self._sequences(req, event.set)
        engine = self._pick_engine(request)
        self.in_flight += 1
        for s in seqs:
            engine.add(s)
        try:
            while not all(s.finished for s in seqs):
                event.clear()
                await event.wait()
            if engine.dead:
                raise ApiError(500, "InternalServerError", ENGINE_DEAD_MESSAGE)
            return seqs
        finally:
            self.in_flight -= 1
            for s in seqs:
                if not s.finished:
                    engine.abort(s)

    def _faults(self) -> None:
        """Apply the fault knobs to a generation request that passed validation."""
        a = self.args
        self.request_count += 1
        if a.sim_crash_after is not None and self.request_count > a.sim_crash_after:
            logger.error("Simulated engine crash (--sim-crash-after %d): exiting.", a.sim_crash_after)
            sys.stderr.flush()
            os._exit(1)
        if a.sim_hang_after is not None and self.request_count > a.sim_hang_after and not self.engine.hung:
            logger.error(
                "Simulated engine hang (--sim-hang-after %d): engine stops stepping.", a.sim_hang_after
            )
            for e in self.engines:
                e.hung = True
        if a.sim_engine_dead_after is not None and self.request_count > a.sim_engine_dead_after:
            if not self.engine.dead:
                logger.error(
                    "Simulated engine death (--sim-engine-dead-after %d): EngineDeadError.",
                    a.sim_engine_dead_after,
                )
                for e in self.engines:
                    e.kill()
            raise ApiError(500, "InternalServerError", ENGINE_DEAD_MESSAGE)
        if a.sim_error_rate > 0 and self.error_rng.random() < a.sim_error_rate:
            raise ApiError(500, "InternalServerError", "Simulated engine error (--sim-error-rate).")

    def _pick_engine(self, request: web.Request | None) -> SimEngine:
        """The data-parallel engine core for a request: the `X-data-parallel-rank` header when it names
        one (generate/base/serving.py:206-218), else the least loaded, lowest rank first on a tie
        (DPLBAsyncMPClient.get_core_engine_for_request, v1/engine/core_client.py:1472-1510: waiting +
        running, waiting penalised by KV-cache pressure above 50 %)."""
        engines = self.engines
        if len(engines) == 1:
            return engines[0]
        if request is not None:
            raw = request.headers.get("X-data-parallel-rank")
            with contextlib.suppress(TypeError, ValueError):
                rank = int(raw)  # type: ignore[arg-type]
                if 0 <= rank < len(engines):
                    return engines[rank]

        def score(e: SimEngine) -> float:
            waiting = len(e.waiting)
            return waiting + len(e.running) + waiting * 6.0 * max(0.0, e.kv_cache_usage - 0.5)

        return min(engines, key=score)

    def _sequences(self, req: SamplingRequest, notify: Callable[[], None]) -> list[Sequence]:
        seqs = []
        mean = self.args.sim_mean_output_tokens
        # The simulated model writes only its output pieces: biases and allowed ids naming other tokens
        # have nothing to act on. When no allowed id is one of them, sampling stays unconstrained.
        bias = None
        if req.logit_bias:
            bias = {i: b for t, b in req.logit_bias.items() if (i := model.vocab_index(t)) is not None}
        allowed = None
        if req.allowed_token_ids:
            allowed = frozenset(i for t in req.allowed_token_ids if (i := model.vocab_index(t)) is not None)
        for ids, _ in req.prompts:
            for j in range(req.n):
                seed_part: object
                if req.temperature == 0.0:
                    seed_part = "greedy"  # greedy decoding: the prompt alone decides
                elif req.seed is not None and req.seed != -1:  # vLLM treats seed -1 as no seed
                    seed_part = (req.seed, j)
                else:
                    # An unseeded sampler differs from request to request, as vLLM's does.
                    seed_part = (self.args.seed, self.request_count, j, "unseeded")
                key = text.request_key(ids, seed_part)
                max_tokens = req.max_tokens or (self.shape.max_model_len - len(ids))
                seqs.append(
                    Sequence(
                        prompt_ids=ids,
                        max_tokens=max_tokens,
                        key=key,
                        mean_len=mean,
                        drift=self.args.sim_quality_drift,
                        greedy=req.temperature == 0.0,
                        keep_contexts=req.wants_logprobs,
                        ignore_eos=req.ignore_eos,
                        min_tokens=req.min_tokens,
                        stop=req.stop,
                        notify=notify,
                        stream=req.stream,
                        bias=bias,
                        allowed=allowed,
                    )
                )
        return seqs

    async def _generate(
        self, request: web.Request, req: SamplingRequest, *, chat: bool
    ) -> web.StreamResponse:
        self._faults()
        try:
            engine_checks(req, self.limits)
        except ApiError as err:
            if not req.stream:
                raise
            return await self._stream_error(request, err)
        event = asyncio.Event()
        seqs = self._sequences(req, event.set)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        engine = self._pick_engine(request)
        self.in_flight += 1
        engine.metrics.request_params_n.observe(req.n)
        engine.metrics.request_params_max_tokens.observe(seqs[0].max_tokens)
        engine.metrics.request_max_num_generation_tokens.observe(seqs[0].max_tokens)
        for s in seqs:
            engine.add(s)
        try:
            if req.stream:
                return await self._stream(request, req, seqs, event, rid, chat)
            while True:
                event.clear()
                if all(s.finished for s in seqs):
                    break
                await event.wait()
            if engine.dead:
                raise ApiError(500, "InternalServerError", ENGINE_DEAD_MESSAGE)
            return _json(self._full_response(req, seqs, rid, chat))
        finally:
            self.in_flight -= 1
            for s in seqs:
                if not s.finished:
                    engine.abort(s)

    @staticmethod
    async def _stream_error(request: web.Request, err: ApiError) -> web.StreamResponse:
        """An error raised once a stream has begun (the engine's checks): vLLM has already answered 200,
        so it sends `data: {"error": ...}` and `data: [DONE]` (chat_completion/serving.py:879-886),
        serialized by json.dumps with its default spacing."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await resp.prepare(request)
        await resp.write(b"data: " + json.dumps(err.body()).encode() + b"\n\ndata: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def _usage(
        self, req: SamplingRequest, seqs: list[Sequence], *, streaming: bool = False
    ) -> dict[str, Any]:
        prompt = sum(len(ids) for ids, _ in req.prompts)
        completion = sum(len(s.out) for s in seqs)
        usage: dict[str, Any] = {
            "prompt_tokens": prompt,
            "total_tokens": prompt + completion,
            "completion_tokens": completion,
        }
        # --enable-prompt-tokens-details: the prefix-cache hit as prompt_tokens_details.cached_tokens, when
        # there is one (one per prompt; the n choices of a prompt share it).
        cached = sum(seqs[i * req.n].num_cached_prompt_tokens for i in range(len(req.prompts)))
        if self.args.enable_prompt_tokens_details and cached:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        elif not streaming:
            # Stream chunks are serialized with exclude_unset=True, which drops the unset details field.
            usage["prompt_tokens_details"] = None
        return usage

    @staticmethod
    def _text(seq: Sequence, start: int, end: int) -> str:
        """Text of output tokens [start, end); a matched stop string and what follows are cut off."""
        vocab = text.VOCAB
        out = "".join([vocab[t] for t in seq.out[start:end]])
        if seq.stop_reason is not None and end == len(seq.out):
            cut = out.find(seq.stop_reason)
            if cut >= 0:
                out = out[:cut]
        return out

    def _chat_logprobs(
        self, seq: Sequence, start: int, end: int, req: SamplingRequest, as_ids: bool = False
    ) -> dict[str, Any]:
        return logprobs.chat_logprobs(
            seq, start, end, req.logprobs or 0, as_ids, req.logprob_token_ids, self.limits.tokenizer
        )

    def _completion_logprobs(
        self, seq: Sequence, start: int, end: int, req: SamplingRequest, offset: int, as_ids: bool = False
    ) -> dict[str, Any]:
        return logprobs.completion_logprobs(
            seq, start, end, req.logprobs or 0, offset, as_ids, req.logprob_token_ids, self.limits.tokenizer
        )

    def _prompt_logprobs(self, req: SamplingRequest, ids: list[int]) -> list[Any] | None:
        if req.prompt_logprobs is None:
            return None
        return logprobs.prompt_logprobs(
            ids, req.prompt_logprobs, self.args.sim_quality_drift, self.limits.tokenizer
        )

    @staticmethod
    def _token_ids(seq: Sequence) -> list[int]:
        return [text.VOCAB_IDS[text.VOCAB[t]] for t in seq.out]

    def _full_response(
        self, req: SamplingRequest, seqs: list[Sequence], rid: str, chat: bool
    ) -> dict[str, Any]:
        created = int(time.time())
        choices = []
        as_ids = req.return_tokens_as_token_ids
        for i, s in enumerate(seqs):
            content = self._text(s, 0, len(s.out))
            if chat:
                content = req.chat_echo + content
                choices.append(
                    {
                        "index": i,
                        "message": {
                            "role": req.role,
                            "content": content,
                            "refusal": None,
                            "annotations": None,
                            "audio": None,
                            "function_call": None,
                            "tool_calls": [],
                            "reasoning": None,
                        },
                        "logprobs": self._chat_logprobs(s, 0, len(s.out), req, as_ids)
                        if req.wants_logprobs
                        else None,
                        "finish_reason": s.finish_reason,
                        "stop_reason": s.stop_reason,
                        "token_ids": self._token_ids(s) if req.return_token_ids else None,
                    }
                )
            else:
                prompt_text = req.prompts[i // req.n][1]
                prefix = prompt_text if req.echo else ""
                choices.append(
                    {
                        "index": i,
                        "text": prefix + content,
                        "logprobs": self._completion_logprobs(s, 0, len(s.out), req, len(prefix), as_ids)
                        if req.wants_logprobs
                        else None,
                        "finish_reason": s.finish_reason,
                        "stop_reason": s.stop_reason,
                        "token_ids": self._token_ids(s) if req.return_token_ids else None,
                        "prompt_logprobs": self._prompt_logprobs(req, s.prompt_ids),
                        "prompt_token_ids": list(s.prompt_ids) if req.return_token_ids else None,
                    }
                )
        body: dict[str, Any] = {
            "id": rid,
            "object": "chat.completion" if chat else "text_completion",
            "created": created,
            "model": req.model,
            "choices": choices,
        }
        # Field order of vLLM's ChatCompletionResponse / CompletionResponse (non-streaming responses are
        # dumped with every field, unset ones as null).
        body["service_tier"] = None
        body["system_fingerprint"] = None
        body["usage"] = self._usage(req, seqs)
        if chat:
            body["prompt_logprobs"] = self._prompt_logprobs(req, seqs[0].prompt_ids)
            body["prompt_token_ids"] = list(seqs[0].prompt_ids) if req.return_token_ids else None
        body["kv_transfer_params"] = None
        return body

    async def _stream(
        self,
        request: web.Request,
        req: SamplingRequest,
        seqs: list[Sequence],
        event: asyncio.Event,
        rid: str,
        chat: bool,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await resp.prepare(request)
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"
        model = req.model
        dumps = orjson.dumps
        sent = [0] * len(seqs)
        done = [False] * len(seqs)
        offsets = [0] * len(seqs)
        hold = [max((len(x) for x in s.stop), default=1) - 1 for s in seqs]
        chars_sent = [0] * len(seqs)
        first_ids_sent = [False] * len(seqs)
        parts: list[bytes] = []
        if chat:
            for i in range(len(seqs)):
                first_choice = {
                    "index": i,
                    "delta": {"role": req.role, "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
                first: dict[str, Any] = {
                    "id": rid,
                    "object": obj,
                    "created": created,
                    "model": model,
                    "choices": [first_choice],
                }
                if req.include_usage and req.continuous_usage:
                    first["usage"] = self._usage(req, seqs, streaming=True)
                if req.return_token_ids:
                    # vLLM: the prompt's token ids on the first chunk, each chunk's own in its choice.
                    first["prompt_token_ids"] = list(seqs[i].prompt_ids)
                    first["choices"] = [{**first_choice, "token_ids": []}]
                parts.append(b"data: " + dumps(first) + b"\n\n")
                if req.chat_echo:
                    echo_chunk = {
                        "id": rid,
                        "object": obj,
                        "created": created,
                        "model": model,
                        "choices": [
                            {
                                "index": i,
                                "delta": {"content": req.chat_echo},
                                "logprobs": None,
                                "finish_reason": None,
                            }
                        ],
                    }
                    parts.append(b"data: " + dumps(echo_chunk) + b"\n\n")
        elif req.echo:
            for i in range(len(seqs)):
                ptxt = req.prompts[i // req.n][1]
                offsets[i] = len(ptxt)
                echo = {
                    "id": rid,
                    "object": obj,
                    "created": created,
                    "model": model,
                    "choices": [
                        {
                            "index": i,
                            "text": ptxt,
                            "logprobs": None,
                            "finish_reason": None,
                            "stop_reason": None,
                        }
                    ],
                }
                parts.append(b"data: " + dumps(echo) + b"\n\n")
        # vLLM sends the role (and echo) chunk from inside its loop over engine outputs, i.e. with the
        # first token: until the engine produces one, a stream is headers only (a hung engine sends
        # nothing more, which is what a proxy's first-byte timeout is for).
        engine_spoke = False
        while True:
            event.clear()
            for i, s in enumerate(seqs):
                if done[i]:
                    continue
                end = len(s.out)
                finished = s.finished
                if end == sent[i] and not finished:
                    continue
                engine_spoke = True
                if hold[i]:
                    # Like vLLM's detokenizer, keep back as many characters as a stop string could
                    # still need, so a stop string spanning several tokens is never half-sent.
                    full = self._text(s, 0, end)
                    limit = len(full) if finished else max(chars_sent[i], len(full) - hold[i])
                    piece = full[chars_sent[i] : limit]
                    chars_sent[i] = limit
                else:
                    piece = self._text(s, sent[i], end)
                new_ids = (
                    [text.VOCAB_IDS[text.VOCAB[t]] for t in s.out[sent[i] : end]]
                    if req.return_token_ids
                    else None
                )
                lp: dict[str, Any] | None = None
                if req.wants_logprobs:
                    as_ids = req.return_tokens_as_token_ids
                    if chat:
                        lp = self._chat_logprobs(s, sent[i], end, req, as_ids)
                    else:
                        lp = self._completion_logprobs(s, sent[i], end, req, offsets[i], as_ids)
                offsets[i] += len(piece)
                sent[i] = end
                if finished:
                    done[i] = True
                if chat:
                    choice: dict[str, Any] = {
                        "index": i,
                        "delta": {"content": piece},
                        "logprobs": lp,
                        "finish_reason": s.finish_reason if finished else None,
                    }
                    if finished:
                        choice["stop_reason"] = s.stop_reason
                else:
                    choice = {
                        "index": i,
                        "text": piece,
                        "logprobs": lp,
                        "finish_reason": s.finish_reason if finished else None,
                        "stop_reason": s.stop_reason if finished else None,
                    }
                    if new_ids is not None and not first_ids_sent[i]:
                        choice["prompt_token_ids"] = list(s.prompt_ids)
                        first_ids_sent[i] = True
                if new_ids is not None:
                    choice["token_ids"] = new_ids
                chunk: dict[str, Any] = {
                    "id": rid,
                    "object": obj,
                    "created": created,
                    "model": model,
                    "choices": [choice],
                }
                if req.include_usage and req.continuous_usage:
                    chunk["usage"] = self._usage(req, seqs, streaming=True)
                parts.append(b"data: " + dumps(chunk) + b"\n\n")
            if all(done):
                if req.include_usage:
                    final = {
                        "id": rid,
                        "object": obj,
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": self._usage(req, seqs, streaming=True),
                    }
                    parts.append(b"data: " + dumps(final) + b"\n\n")
                parts.append(b"data: [DONE]\n\n")
                await resp.write(b"".join(parts))
                break
            if parts and engine_spoke:
                await resp.write(b"".join(parts))
                parts = []
            await event.wait()
        await resp.write_eof()
        return resp


def _listen_socket(host: str | None, port: int) -> socket.socket:
    """Bind and listen before the 'model' is loaded: clients can connect but get no answer until ready."""
    bind_host = host or "0.0.0.0"
    family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((bind_host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


async def serve(args: argparse.Namespace) -> int:
    """Run the simulated server until SIGINT/SIGTERM; returns the process exit code."""
    quant = args.quantization
    if quant is not None and quant not in QUANTIZATION_METHODS:
        # ModelConfig._verify_quantization (config/model.py:1326-1331): no argparse choices, so an unknown
        # method fails when the engine is configured.
        logger.error(
            "ValueError: Unknown quantization method: %s. Must be one of %s.",
            quant,
            list(QUANTIZATION_METHODS_ORDER),
        )
        return 1
    if args.data_parallel_size > 1:
        # vLLM runs one API server per DP rank by default (api_server_count = data_parallel_size) and
        # then serves metrics through prometheus_client's multiprocess collector, which has no
        # `_created` series (vllm/entrypoints/cli/serve.py:272-273).
        disable_created_metrics()
    try:
        shape = build_shape(args)
    except EngineConfigError as exc:
        logger.error("ValueError: %s", exc)
        return 1
    placement: ray_cluster.RayPlacement | None = None
    if args.distributed_executor_backend == "ray":
        world_size = args.tensor_parallel_size * args.pipeline_parallel_size
        try:
            placement = await asyncio.to_thread(ray_cluster.join, world_size, args.sim_ray_placement_timeout)
        except ray_cluster.RayClusterError as exc:
            logger.error("ValueError: %s", exc)
            return 1
        logger.info(
            "Ray executor: a placement group of %d GPU bundles on node(s) %s.",
            world_size,
            ", ".join(placement.node_ips.get(n, n) for n in placement.node_ids),
        )
    server = SimServer(args, shape)
    try:
        sock = _listen_socket(args.host, args.port)
    except OSError as exc:
        logger.error("[Errno %s] error while attempting to bind on address: %s", exc.errno, exc.strerror)
        return 1
    logger.info(
        "Simulated engine %s (profile %s): %d GPU blocks of %d tokens (%d tokens), max_model_len=%d, "
        "max_num_seqs=%d, max_num_batched_tokens=%d, time scale x%g.",
        args.model,
        shape.profile.name,
        shape.num_gpu_blocks,
        shape.block_size,
        shape.kv_cache_size_tokens,
        shape.max_model_len,
        shape.max_num_seqs,
        shape.max_num_batched_tokens,
        args.sim_time_scale,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if args.sim_startup_delay > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), args.sim_startup_delay)
        if stop.is_set():
            sock.close()
            return 0
    for engine in server.engines:
        engine.start()
    # vLLM's default --shutdown-timeout is 0: in-flight requests are aborted on shutdown.
    runner = web.AppRunner(
        server.build_app(), handler_cancellation=True, access_log=None, shutdown_timeout=0.5
    )
    await runner.setup()
    site = web.SockSite(runner, sock)
    await site.start()
    server.ready = True
    # Everything allocated so far lives until exit: keep it out of the garbage collector's scans.
    gc.freeze()
    host = args.host or "0.0.0.0"
    logger.info("Starting vLLM API server (simulated) on http://%s:%d", host, args.port)
    logger.info("Application startup complete.")
    exit_code = 0
    watch: asyncio.Task[None] | None = None
    if placement is not None:

        async def watch_nodes() -> None:
            # vLLM's Ray workers die with their node, and the engine core with them: the server exits.
            nonlocal exit_code
            while not stop.is_set():
                lost = await asyncio.to_thread(placement.lost_nodes)
                if lost:
                    logger.error(
                        "ray.exceptions.ActorDiedError: a Ray worker of this engine died: its node %s is "
                        "gone. EngineCore encountered a fatal error; shutting down.",
                        ", ".join(lost),
                    )
                    exit_code = 1
                    stop.set()
                    return
                await asyncio.sleep(0.5)

        watch = asyncio.create_task(watch_nodes())
    await stop.wait()
    logger.info("Shutting down.")
    if watch is not None:
        watch.cancel()
    for engine in server.engines:
        await engine.stop()
    await runner.cleanup()
    if placement is not None:
        # Leaving the cluster must not hold the exit when the cluster itself is gone: a daemon thread,
        # given 3 s.
        leaving = threading.Thread(target=placement.close, daemon=True)
        leaving.start()
        await asyncio.to_thread(leaving.join, 3.0)
    return exit_code
