"""The process a fleet agent runs on its host for a deployment that spans hosts (no Django, like the agent).

With Ray, vLLM runs one model over several hosts on a Ray cluster that exists before `vllm serve` starts
(vLLM docs/serving/parallelism_scaling.md, "Multi-node deployment"): `ray start --head` on the node
that will run the engine, `ray start --address=<head>:<port>` on each other node, each with
VLLM_HOST_IP set to the address that node has in the cluster; then `vllm serve ... --tensor-parallel-size
<GPUs per node> --pipeline-parallel-size <nodes> --distributed-executor-backend ray` on the head.

With the mp backend there is no cluster ("Running vLLM with MultiProcessing"): the head's engine is the
deployment's own launch with `--nnodes N --node-rank 0 --master-addr <head>`, and each other host runs
`vllm serve ... --nnodes N --node-rank R --master-addr <head> --headless`, a node of workers only. That
headless process is what this module runs on a member host, one per launch of the head (its start
token), as the control plane's plan says (`launch`, built by nodes/engines/vllm.py like any engine's).

The control plane tells each agent which role its host plays (`ray` in the sync answer, see
nodes/agent_channel.describe_ray); the agent runs `ray start --block` (or the headless `vllm serve`) in
its own session, so the whole node (GCS, raylet, its workers) is one session it can stop, and so the
node outlives an agent restart as engines do. A Ray node is "joined" once `ray start` printed that the
runtime started; a headless node counts as joined while it runs (its workers meet the head's by
themselves).
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nodes import process

# `ray start` prints this once the node's raylet is registered with the head's GCS.
STARTED_LINE = b"Ray runtime started."


@dataclass
class RayNode:
    """One `ray start --block` this agent runs for a deployment (its session holds the whole node)."""

    deployment_id: int
    role: str  # head | worker
    pid: int
    token: str
    log_path: str
    head_address: str
    started_at: float
    joined: bool = False
    # "ray", or "mp" for vLLM's headless node of one launch of the head (`launch_token`, its start token).
    backend: str = "ray"
    launch_token: str = ""

    def alive(self) -> bool:
        return process.is_alive(self.pid)

    def check_joined(self) -> bool:
        if self.backend == "mp":
            return self.alive()
        if not self.joined:
            with contextlib.suppress(OSError):
                self.joined = STARTED_LINE in Path(self.log_path).read_bytes()[-65536:]
        return self.joined


def free_port() -> int:
    """A TCP port free on this host a moment ago (bound to port 0 and read back)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def ray_executable() -> str:
    """The `ray` CLI of the agent's own environment (engines run with the same interpreter)."""
    return str(Path(sys.executable).with_name("ray"))


def start_argv(plan: dict[str, Any], *, temp_dir: str | None = None) -> list[str]:
    """`ray start` for this host's role in the deployment's cluster (plan: agent_channel.describe_ray).

    Ports Ray would otherwise take at fixed defaults (the dashboard agent's 52365, the dashboard's 8265)
    are picked free on this host, so two nodes can share a machine; the dashboard itself stays off and
    the object store is bounded (the engine passes tensors through its own channels, not Ray objects).
    """
    argv = [ray_executable(), "start", "--block", "--disable-usage-stats"]
    if plan["role"] == "head":
        argv += ["--head", "--port", str(plan["port"]), "--include-dashboard=false"]
        argv += ["--dashboard-port", str(free_port())]
        if temp_dir:
            argv += ["--temp-dir", temp_dir]
    else:
        argv += ["--address", str(plan["head_address"])]
    argv += [
        "--node-ip-address",
        str(plan["node_ip"]),
        "--num-gpus",
        str(plan["num_gpus"]),
        "--object-store-memory",
        str(plan["object_store_memory"]),
        "--dashboard-agent-listen-port",
        str(free_port()),
    ]
    return argv


def start_env(plan: dict[str, Any]) -> dict[str, str]:
    env = {"VLLM_HOST_IP": str(plan["node_ip"]), "RAY_USAGE_STATS_ENABLED": "0"}
    if plan.get("gpu_indices"):
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in plan["gpu_indices"])
    return env


def _directory(engine_dir: Path) -> Path:
    return engine_dir / "ray"


def start(
    plan: dict[str, Any], engine_dir: Path, *, temp_dir: str | None = None, log_keep: int = 3
) -> RayNode:
    """Start this host's Ray node for the deployment, in its own session, and record it on disk."""
    return _start(
        plan,
        engine_dir,
        argv=start_argv(plan, temp_dir=temp_dir),
        env=start_env(plan),
        port=int(plan.get("port") or 0),
        log_keep=log_keep,
    )


def start_headless(plan: dict[str, Any], engine_dir: Path, argv: list[str], log_keep: int = 3) -> RayNode:
    """Start this member host's headless `vllm serve` for the head's current launch: `argv` is the
    plan's (plan["launch"], built by the control plane) with the agent's interpreter put in."""
    launch = plan["launch"]
    return _start(
        plan,
        engine_dir,
        argv=argv,
        env={str(k): str(v) for k, v in launch.get("env", {}).items()},
        port=0,
        log_keep=int(launch.get("log_keep", log_keep)),
        backend="mp",
        launch_token=str(plan["start_token"]),
    )


def _start(
    plan: dict[str, Any],
    engine_dir: Path,
    *,
    argv: list[str],
    env: dict[str, str],
    port: int,
    log_keep: int,
    backend: str = "ray",
    launch_token: str = "",
) -> RayNode:
    """Run one node in its own session (its token in the environment) and record it on disk."""
    token = f"{backend}-{uuid.uuid4().hex}"
    directory = _directory(engine_dir)
    record = process.start_engine(
        argv=argv,
        env=env,
        directory=directory,
        deployment_id=int(plan["deployment_id"]),
        port=port,
        start_token=token,
        log_keep=log_keep,
    )
    node = RayNode(
        deployment_id=int(plan["deployment_id"]),
        role=str(plan["role"]),
        pid=record.pid,
        token=token,
        log_path=record.log_path,
        head_address=str(plan["head_address"]),
        started_at=record.started_at,
        backend=backend,
        launch_token=launch_token,
    )
    _save(node, directory)
    return node


def _save(node: RayNode, directory: Path) -> None:
    path = directory / f"ray-node-{node.deployment_id}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(node)))
    tmp.replace(path)


def adopt(engine_dir: Path) -> dict[int, RayNode]:
    """Ray nodes a previous run of this agent started that still run (their session carries our token)."""
    found: dict[int, RayNode] = {}
    for path in sorted(_directory(engine_dir).glob("ray-node-*.json")):
        with contextlib.suppress(OSError, ValueError, TypeError):
            node = RayNode(**json.loads(path.read_text()))
            if node.alive() and process.carries_token(node.pid, node.token):
                found[node.deployment_id] = node
                continue
            path.unlink()
    return found


def stop(node: RayNode, engine_dir: Path, timeout: float = 5.0) -> None:
    """Stop the node: SIGTERM to `ray start`'s group, then SIGKILL to every process left in its session
    (Ray's workers sit in process groups of their own), so no raylet or worker stays behind."""
    process.signal_group(node.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.session_pids(node.pid):
        time.sleep(0.1)
    process.kill_session(node.pid)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and process.is_alive(node.pid):
        time.sleep(0.05)
    directory = _directory(engine_dir)
    process.forget_record(directory, node.deployment_id)
    with contextlib.suppress(FileNotFoundError):
        (directory / f"ray-node-{node.deployment_id}.json").unlink()


def stop_all_under(directory: Path) -> int:
    """Kill every Ray node whose record lies under `directory` (tests, `stop_engines`); how many."""
    stopped = 0
    for path in directory.rglob("ray-node-*.json"):
        with contextlib.suppress(OSError, ValueError, TypeError):
            node = RayNode(**json.loads(path.read_text()))
            if process.carries_token(node.pid, node.token) or process.session_pids(node.pid):
                process.kill_session(node.pid)
                stopped += 1
            path.unlink()
    return stopped
