"""Run a node agent: a Celery worker on the host's queue plus the supervision/telemetry loop.

One process per host. The worker uses a thread pool, so engine processes are children of this
process (their exits are reaped here) and tasks and the supervisor share the per-deployment locks.
Engines run in their own sessions: stopping the agent leaves them serving, and the next agent
start re-adopts them.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from core.celery import app, node_queue
from nodes.agent.gpus import GpuSource, simulated_gpu_config
from nodes.agent.supervisor import Supervisor
from nodes.models import Host

log = logging.getLogger("nodes.agent")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="inferchain node agent")
    parser.add_argument("--host", required=True, help="Host name as registered in the console.")
    parser.add_argument("--address", default=None, help="Address engines are reached at (first run).")
    parser.add_argument(
        "--simulated-gpus",
        type=int,
        default=None,
        help="Without NVML, report this many simulated GPUs (default: 1 when no NVIDIA GPU is found).",
    )
    parser.add_argument(
        "--simulated-gpu-profile",
        default="h100-llama3-8b-fp16",
        help="Simulator profile whose GPU (name, memory, idle power) the simulated GPUs copy.",
    )
    parser.add_argument("--concurrency", type=int, default=4, help="Celery worker threads.")
    parser.add_argument("--loglevel", default="info")
    return parser


def ensure_host(name: str, address: str | None) -> None:
    """A host runs its agent before an admin has typed it in: register it on first start."""
    host, created = Host.objects.get_or_create(name=name, defaults={"address": address or "127.0.0.1"})
    if not created and address and host.address != address:
        host.address = address
        host.save(update_fields=["address", "updated_at"])


def run(options: Any) -> None:
    ensure_host(options.host, options.address)
    probe = GpuSource(options.host)
    if not probe.nvml_available:
        count = 1 if options.simulated_gpus is None else options.simulated_gpus
        probe = GpuSource(options.host, simulated_gpu_config(options.simulated_gpu_profile, count))
        log.warning("%s Reporting %d simulated GPU(s), marked simulated.", probe.nvml_error, count)
    supervisor = Supervisor(options.host, probe)
    supervisor.start()
    supervisor.start_loop()
    try:
        app.worker_main(
            [
                "worker",
                "-Q",
                node_queue(options.host),
                "-P",
                "threads",
                "-c",
                str(options.concurrency),
                "-n",
                f"agent-{options.host}@%h",
                "-l",
                options.loglevel,
                "--without-gossip",
                "--without-mingle",
            ]
        )
    finally:
        supervisor.close()
