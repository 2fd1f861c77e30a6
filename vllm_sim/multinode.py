"""`--nnodes N` with the multiprocessing executor: the simulator's nodes meet as vLLM's do, without Ray.

vLLM's own launch (docs/serving/parallelism_scaling.md, "Running vLLM with MultiProcessing"): the head runs
`vllm serve MODEL --tensor-parallel-size 8 --pipeline-parallel-size 2 --nnodes 2 --node-rank 0
--master-addr HEAD_IP`, every other node the same with `--node-rank R --headless`. The flags are
ParallelConfig's (vllm/config/parallel.py:270-281: master_addr 127.0.0.1, master_port 29501, node_rank,
nnodes) under the names of vllm/engine/arg_utils.py:1025-1028 (`-n` and `-r` are the short forms). Every
node's workers join one torch.distributed process group whose store is at master_addr:master_port
(vllm/distributed/parallel_state.py:1623-1626), so the head cannot serve until every node has joined; a
headless node runs workers only, no API server (vllm/entrypoints/cli/serve.py:208-224).

The simulator keeps that shape with one TCP connection per headless node: the head listens on
master_addr:master_port and waits for nodes 1..N-1 (each says who it is in one JSON line and is told
"ok" or why not), then loads and serves; a headless node connects (retrying until the head is up),
and holds the connection until it is stopped. Losing the connection ends the other side, as a dead
peer ends a torch.distributed job: the head exits with code 1 (vLLM's engine core dies at its next
collective; its execute_model waits at most VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS, 300 s, vllm/envs.py:241),
and a headless node whose head went away exits too.

How long a side waits for the other is torch.distributed's default process-group timeout (10 minutes
for NCCL); `--sim-peer-timeout` shortens it for tests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import time
from dataclasses import dataclass, field

logger = logging.getLogger("vllm.distributed")

DEFAULT_MASTER_PORT = 29501  # vllm/config/parallel.py:273
PEER_TIMEOUT = 600.0
# Why these backends (vllm/config/parallel.py:964-972): nnodes > 1 needs one vLLM starts itself per node.
NNODES_BACKENDS = ("mp", "uni", "external_launcher")


class PeerError(RuntimeError):
    """The nodes did not meet, or one of them went away (the message says which and why)."""


def check(args: argparse.Namespace) -> str | None:
    """vLLM's refusals of a multi-node launch, in its words; None when the command line is consistent."""
    if args.nnodes <= 1:
        if args.headless:
            return (
                "The simulator's --headless runs a worker node of a multi-node launch: give --nnodes N "
                "(N > 1) and this node's --node-rank (1..N-1)."
            )
        return None
    if (
        args.distributed_executor_backend is not None
        and args.distributed_executor_backend not in NNODES_BACKENDS
    ):
        # vllm/config/parallel.py:964-972
        return "nnodes > 1 can only be set when distributed executor backend is mp, uni or external_launcher."
    world_size = args.data_parallel_size * args.pipeline_parallel_size * args.tensor_parallel_size
    if world_size % args.nnodes:
        # vllm/engine/arg_utils.py:2096-2102
        return (
            f"Invalid data-parallel launch options: `--nnodes {args.nnodes}` must evenly divide the total "
            f"world size ({world_size}). Adjust `--nnodes`, `--data-parallel-size`, "
            "`--pipeline-parallel-size`, or `--tensor-parallel-size`."
        )
    if not 0 <= args.node_rank < args.nnodes:
        # vllm/engine/arg_utils.py:2104-2110
        return (
            "Invalid data-parallel launch options: `--node-rank` must be between 0 and "
            f"{args.nnodes - 1}; got `--node-rank {args.node_rank}`. Set it to this node's zero-based index."
        )
    if args.node_rank > 0 and not args.headless:
        return (
            f"--node-rank {args.node_rank} runs workers only: add --headless (vLLM's documented launch; "
            "the API server runs on node rank 0)."
        )
    if args.node_rank == 0 and args.headless:
        return "Node rank 0 runs the API server: drop --headless there."
    return None


def _hello(args: argparse.Namespace) -> dict[str, object]:
    return {
        "node_rank": args.node_rank,
        "nnodes": args.nnodes,
        "world_size": args.tensor_parallel_size * args.pipeline_parallel_size,
        "model": args.model,
    }


@dataclass
class Head:
    """Node rank 0's side: the store's listening socket and one open connection per headless node."""

    args: argparse.Namespace
    server: asyncio.Server | None = None
    peers: dict[int, tuple[asyncio.StreamReader, asyncio.StreamWriter, str]] = field(default_factory=dict)
    joined: asyncio.Event = field(default_factory=asyncio.Event)

    async def open(self) -> None:
        try:
            self.server = await asyncio.start_server(self._peer, self.args.master_addr, self.args.master_port)
        except OSError as exc:
            raise PeerError(
                f"The server socket has failed to listen on {self.args.master_addr}:{self.args.master_port} "
                f"(errno: {exc.errno} - {exc.strerror})."
            ) from exc

    async def _peer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        address = str(writer.get_extra_info("peername", ("?",))[0])
        try:
            hello = json.loads(await asyncio.wait_for(reader.readline(), 10))
        except (TimeoutError, ValueError, ConnectionError):
            writer.close()
            return
        mine = _hello(self.args)
        problem = None
        rank = hello.get("node_rank") if isinstance(hello, dict) else None
        if not isinstance(rank, int) or not 0 < rank < self.args.nnodes:
            problem = f"node rank {rank!r} is not one of 1..{self.args.nnodes - 1}"
        elif rank in self.peers:
            problem = f"node rank {rank} has joined already (from {self.peers[rank][2]})"
        else:
            for name in ("nnodes", "world_size", "model"):
                if hello.get(name) != mine[name]:
                    problem = f"its {name} is {hello.get(name)!r}, the head's is {mine[name]!r}"
                    break
        if problem:
            logger.error("Refused a node from %s: %s.", address, problem)
            writer.write((json.dumps({"error": problem}) + "\n").encode())
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            writer.close()
            return
        assert isinstance(rank, int)
        self.peers[rank] = (reader, writer, address)
        logger.info(
            "Node rank %d joined from %s (%d/%d nodes).", rank, address, len(self.peers) + 1, self.args.nnodes
        )
        if len(self.peers) == self.args.nnodes - 1:
            for _, peer_writer, _ in self.peers.values():
                peer_writer.write(b'{"ok": true}\n')
            self.joined.set()

    async def wait(self, timeout: float) -> None:
        """Until every node has joined; PeerError after `timeout` seconds, as torch's store says it."""
        logger.info(
            "Waiting for %d node(s) to join the process group at %s:%d.",
            self.args.nnodes - 1,
            self.args.master_addr,
            self.args.master_port,
        )
        try:
            await asyncio.wait_for(self.joined.wait(), timeout)
        except TimeoutError:
            raise PeerError(
                f"torch.distributed.DistStoreError: Timed out after {timeout:g} seconds waiting for clients. "
                f"{len(self.peers) + 1}/{self.args.nnodes} clients joined."
            ) from None

    async def lost(self) -> str:
        """Returns, once a headless node's connection closes, what went: 'node rank R (address)'."""
        waits = {
            asyncio.ensure_future(reader.read()): (rank, address)
            for rank, (reader, _, address) in self.peers.items()
        }
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()
        rank, address = waits[next(iter(done))]
        return f"node rank {rank} ({address})"

    def close(self) -> None:
        for _, writer, _ in self.peers.values():
            writer.close()
        if self.server is not None:
            self.server.close()


async def run_headless(args: argparse.Namespace, stop: asyncio.Event) -> int:
    """A worker node (`--headless --node-rank R`): join the head, hold on until stopped or the head goes."""
    address = f"{args.master_addr}:{args.master_port}"
    # vllm/entrypoints/cli/serve.py:214-219
    logger.info(
        "Launching vLLM (v0.28.0.dev0+sim) headless multiproc executor, with head node address %s for "
        "torch.distributed process group.",
        address,
    )
    deadline = time.monotonic() + args.sim_peer_timeout
    writer: asyncio.StreamWriter | None = None
    while writer is None:
        try:
            # From the address this node has among the others (VLLM_HOST_IP, vLLM's multi-node docs).
            local = (os.environ["VLLM_HOST_IP"], 0) if os.environ.get("VLLM_HOST_IP") else None
            reader, writer = await asyncio.open_connection(
                args.master_addr, args.master_port, local_addr=local
            )
        except OSError:
            if time.monotonic() > deadline:
                logger.error(
                    "torch.distributed.DistNetworkError: The client socket has timed out after %gs while "
                    "trying to connect to (%s, %d).",
                    args.sim_peer_timeout,
                    args.master_addr,
                    args.master_port,
                )
                return 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
            if stop.is_set():
                return 0
    writer.write((json.dumps(_hello(args)) + "\n").encode())
    await writer.drain()
    answer_task = asyncio.ensure_future(reader.readline())
    stop_task = asyncio.ensure_future(stop.wait())
    try:
        done, _ = await asyncio.wait(
            {answer_task, stop_task},
            timeout=max(0.0, deadline - time.monotonic()),
            return_when=asyncio.FIRST_COMPLETED,
        )
        if stop_task in done:
            return 0
        if answer_task not in done:
            logger.error("Timed out waiting for the other nodes to join at %s.", address)
            return 1
        try:
            answer = json.loads(answer_task.result() or b"{}")
        except ValueError:
            answer = {}
        if not answer.get("ok"):
            logger.error(
                "The head at %s refused this node: %s.", address, answer.get("error", "it went away")
            )
            return 1
        logger.info(
            "Node rank %d of %d joined the process group at %s.", args.node_rank, args.nnodes, address
        )
        gone_task = asyncio.ensure_future(reader.read())
        done, _ = await asyncio.wait({gone_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
        gone_task.cancel()
        if stop_task in done:
            logger.info("Shutting down.")
            return 0
        logger.error(
            "The head node at %s went away: the process group is broken. Worker node rank %d exits.",
            address,
            args.node_rank,
        )
        return 1
    finally:
        answer_task.cancel()
        stop_task.cancel()
        writer.close()
