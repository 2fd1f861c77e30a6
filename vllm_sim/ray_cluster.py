"""`--distributed-executor-backend ray`: the simulator joins the Ray cluster as vLLM does.

vLLM's Ray executor (vllm/v1/executor/ray_utils.py, initialize_ray_cluster) connects to the running
cluster with `ray.init(address=...)` (RAY_ADDRESS), asks for a placement group of world_size
(tensor x pipeline) bundles of one GPU each, the first pinned to the node the engine runs on, packed
(strategy "PACK"), and waits for it: it warns when the cluster has fewer GPUs than that, and gives up
after PG_WAIT_TIMEOUT (1800 s) with "Cannot provide a placement group ...". Its workers are Ray actors
in those bundles; when a node holding one dies the actors die and the engine core with them, so the
API server exits. The simulator does the same with real Ray (no actors: the bundles hold the GPUs),
and exits when a node of its placement group is gone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("vllm.v1.executor.ray_utils")

# vLLM's wait for the placement group (ray_utils.py PG_WAIT_TIMEOUT); --sim-ray-placement-timeout
# shortens it for tests.
PG_WAIT_TIMEOUT = 1800.0


class RayClusterError(RuntimeError):
    """The engine could not get its placement group (the message is vLLM's)."""


@dataclass
class RayPlacement:
    """The placement group this engine holds, and the Ray nodes its bundles landed on."""

    ray: Any
    group: Any
    node_ids: list[str]
    node_ips: dict[str, str]

    def lost_nodes(self) -> list[str]:
        """The IPs of the placement group's nodes that Ray no longer counts alive."""
        alive = {n["NodeID"] for n in self.ray.nodes() if n.get("Alive")}
        return [self.node_ips.get(node_id, node_id) for node_id in self.node_ids if node_id not in alive]

    def close(self) -> None:
        with contextlib.suppress(Exception):  # the cluster may be gone already
            self.ray.util.remove_placement_group(self.group)
        self.ray.shutdown()


def join(world_size: int, timeout: float = PG_WAIT_TIMEOUT) -> RayPlacement:
    """Connect to the cluster (RAY_ADDRESS) and reserve world_size GPU bundles; RayClusterError if not."""
    # Imported here, not at the top: Ray is optional (the dev and gpu extras), heavy (a second of import),
    # and only this executor needs it; the simulator runs without it everywhere else.
    try:
        import ray
        from ray.util.placement_group import placement_group, placement_group_table
    except ImportError as exc:
        raise RayClusterError(
            "Failed to import Ray: the ray backend needs the `ray` package on every node (pip install ray)."
        ) from exc
    address = os.environ.get("RAY_ADDRESS") or "auto"
    # VLLM_HOST_IP is the address this node has in the cluster (vLLM's multi-node docs); Ray's driver
    # must name the same one or it finds no raylet of its own on this host.
    node_ip = os.environ.get("VLLM_HOST_IP") or None
    try:
        ray.init(
            address=address, _node_ip_address=node_ip, log_to_driver=False, logging_level=logging.WARNING
        )
    except Exception as exc:
        raise RayClusterError(f"Could not connect to the Ray cluster at {address}: {exc}") from exc
    gpus_in_cluster = ray.cluster_resources().get("GPU", 0)
    if world_size > gpus_in_cluster:
        logger.warning(
            "The number of required GPUs exceeds the total number of available GPUs in the placement group."
        )
    specs: list[dict[str, float]] = [{"GPU": 1.0} for _ in range(world_size)]
    current_ip = node_ip or ray.util.get_node_ip_address()
    # At least the first bundle on the engine's own node: the driver is a worker too.
    specs[0][f"node:{current_ip}"] = 0.001
    group = placement_group(specs, strategy="PACK")
    began = time.monotonic()
    wait = 10.0
    while not group.wait(timeout_seconds=min(wait, max(0.1, timeout - (time.monotonic() - began)))):
        waited = time.monotonic() - began
        if waited >= timeout:
            ray.util.remove_placement_group(group)
            ray.shutdown()
            raise RayClusterError(
                f"Cannot provide a placement group of placement_group_specs={specs} within {timeout:g} "
                "seconds. See `ray status` and `ray list nodes` to make sure the cluster has enough "
                "resources."
            )
        logger.info(
            "Waiting for creating a placement group of specs for %d seconds. specs=%s. Check `ray status` "
            "and `ray list nodes` to see if you have enough resources, and make sure the IP addresses "
            "used by ray cluster are the same as VLLM_HOST_IP environment variable specified in each "
            "node if you are running on a multi-node.",
            int(waited),
            specs,
        )
    table = placement_group_table(group)
    # In bundle order: bundle 0 sits on the engine's own node (the first pipeline stage).
    bundles = table.get("bundles_to_node_id", {})
    node_ids = list(dict.fromkeys(bundles[index] for index in sorted(bundles)))
    node_ips = {n["NodeID"]: n.get("NodeManagerAddress", "") for n in ray.nodes()}
    return RayPlacement(ray=ray, group=group, node_ids=node_ids, node_ips=node_ips)
