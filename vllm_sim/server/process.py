"""One simulated `vllm serve` process from start to exit: the engine shape from the command line, the
checks vLLM makes before loading, Ray placement, binding, the other nodes of a multi-node launch, the
startup delay, serving until SIGINT/SIGTERM (or a lost Ray node or peer node) and shutdown. A headless
node (`--headless --node-rank R`) serves nothing: it joins the head and holds on (vllm_sim/multinode.py)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import signal
import socket
import threading
from typing import Any

from aiohttp import web
from prometheus_client import disable_created_metrics

from vllm_sim import multinode, ray_cluster
from vllm_sim.profiles import PROFILES, EngineConfigError, EngineShape, derive_engine_shape
from vllm_sim.server.app import SimServer

logger = logging.getLogger("vllm_sim")


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
    problem = multinode.check(args)
    if problem:
        logger.error("ValueError: %s", problem)
        return 1
    if args.headless:
        return await _headless(args)
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
    stop = _stop_on_signals()
    head: multinode.Head | None = None
    if args.nnodes > 1:
        # The workers of every node join one process group before the model loads; until then the
        # API socket accepts and answers nothing, as while loading.
        head = multinode.Head(args)
        try:
            await head.open()
            joining = asyncio.ensure_future(head.wait(args.sim_peer_timeout))
            stopping = asyncio.ensure_future(stop.wait())
            await asyncio.wait({joining, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if not joining.done():
                joining.cancel()
                head.close()
                sock.close()
                return 0
            joining.result()
        except multinode.PeerError as exc:
            logger.error("%s", exc)
            head.close()
            sock.close()
            return 1
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
    if head is not None:
        peers = head

        async def watch_peers() -> None:
            # A node of the process group went away: vLLM's next collective fails and the engine core
            # dies with it (multinode.py says when); the server exits.
            nonlocal exit_code
            lost = await peers.lost()
            logger.error(
                "The worker(s) of %s left the torch.distributed process group. EngineCore encountered a "
                "fatal error; shutting down.",
                lost,
            )
            exit_code = 1
            stop.set()

        watch = asyncio.create_task(watch_peers())
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
    if head is not None:
        head.close()
    if placement is not None:
        # Leaving the cluster must not hold the exit when the cluster itself is gone: a daemon thread,
        # given 3 s.
        leaving = threading.Thread(target=placement.close, daemon=True)
        leaving.start()
        await asyncio.to_thread(leaving.join, 3.0)
    return exit_code


def _stop_on_signals() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM: the server's (or a headless node's) signal to shut down."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def _headless(args: argparse.Namespace) -> int:
    """`--headless`: a worker node of a multi-node launch, until stopped or its head goes away."""
    return await multinode.run_headless(args, _stop_on_signals())
