"""The simulator's multi-node launch without Ray, as vLLM's (vllm_sim/multinode.py): the head
(`--nnodes 2 --node-rank 0`) serves only once the headless node (`--node-rank 1 --headless`) has joined
at the master port, either side goes when the other does, and the command lines vLLM refuses are
refused with vLLM's words."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.sim.conftest import MODEL, SimFactory
from tests.sim.http import call, call_json
from vllm_sim.testing import REPO_ROOT, SimHandle, free_port

SHAPE = ("-tp", "1", "-pp", "2")


def node_args(master_port: int, rank: int, *extra: str) -> tuple[str, ...]:
    args = (
        *SHAPE,
        "-n",
        "2",
        "-r",
        str(rank),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(master_port),
    )
    return (*args, "--headless", *extra) if rank else (*args, *extra)


def wait_exit(handle: SimHandle, timeout: float = 15.0) -> int:
    deadline = time.monotonic() + timeout
    while handle.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not handle.alive(), handle.log_text()
    code = handle.proc.returncode
    assert code is not None
    return code


def answers(handle: SimHandle) -> bool:
    try:
        return call(handle.base_url + "/health", timeout=0.3)[0] == 200
    except OSError:
        return False


def test_the_head_serves_once_the_headless_node_joins_and_exits_when_it_leaves(
    sim_factory: SimFactory,
) -> None:
    master = free_port()
    head = sim_factory(*node_args(master, 0), wait=False)
    time.sleep(1.5)
    assert head.alive(), head.log_text()
    assert not answers(head), "the head served before the other node joined"
    assert "Waiting for 1 node(s) to join the process group at 127.0.0.1:" in head.log_text()

    worker = sim_factory(*node_args(master, 1), wait=False)
    head.wait_healthy(20)
    status, reply = call_json(
        head.openai_base_url + "/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 3}, timeout=10
    )
    assert status == 200 and reply["usage"]["completion_tokens"] == 3
    assert "Node rank 1 joined from 127.0.0.1 (2/2 nodes)." in head.log_text()
    worker_log = worker.log_text()
    assert f"headless multiproc executor, with head node address 127.0.0.1:{master}" in worker_log
    assert "Node rank 1 of 2 joined the process group" in worker_log
    assert "Starting vLLM API server" not in worker_log  # a headless node serves nothing

    worker.proc.kill()
    assert wait_exit(head) == 1
    assert (
        "The worker(s) of node rank 1 (127.0.0.1) left the torch.distributed process group" in head.log_text()
    )


def test_a_headless_node_exits_when_its_head_goes(sim_factory: SimFactory) -> None:
    master = free_port()
    # Started first: it keeps trying the master port until the head listens.
    worker = sim_factory(*node_args(master, 1), wait=False)
    time.sleep(1.0)
    head = sim_factory(*node_args(master, 0), wait=False)
    head.wait_healthy(20)
    assert head.stop() == 0
    assert wait_exit(worker) == 1
    assert "The head node at 127.0.0.1:" in worker.log_text() and "went away" in worker.log_text()


def test_waits_end_with_torch_distributed_timeouts(sim_factory: SimFactory) -> None:
    head = sim_factory(*node_args(free_port(), 0, "--sim-peer-timeout", "1"), wait=False)
    assert wait_exit(head) == 1
    assert "Timed out after 1 seconds waiting for clients. 1/2 clients joined." in head.log_text()
    worker = sim_factory(*node_args(free_port(), 1, "--sim-peer-timeout", "1"), wait=False)
    assert wait_exit(worker) == 1
    assert (
        "The client socket has timed out after 1s while trying to connect to (127.0.0.1," in worker.log_text()
    )


def test_the_head_refuses_a_node_of_another_shape(sim_factory: SimFactory) -> None:
    master = free_port()
    head = sim_factory(*node_args(master, 0), wait=False)
    odd = sim_factory(
        "-tp", "2", "-pp", "2", "-n", "2", "-r", "1", "--master-port", str(master), "--headless", wait=False
    )
    assert wait_exit(odd) == 1
    assert "refused this node: its world_size is 4, the head's is 2" in odd.log_text()
    assert head.alive() and not answers(head)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("-pp", "2", "--nnodes", "2", "--distributed-executor-backend", "ray"),
            "nnodes > 1 can only be set when distributed executor backend is mp, uni or external_launcher.",
        ),
        (("-pp", "3", "--nnodes", "2"), "`--nnodes 2` must evenly divide the total world size (3)."),
        (
            ("-pp", "2", "--nnodes", "2", "--node-rank", "2", "--headless"),
            "`--node-rank` must be between 0 and 1",
        ),
        (
            ("-pp", "2", "--nnodes", "2", "--node-rank", "1"),
            "--node-rank 1 runs workers only: add --headless",
        ),
        (("--headless",), "--headless runs a worker node of a multi-node launch"),
    ],
)
def test_launches_vllm_refuses_are_refused(args: tuple[str, ...], message: str) -> None:
    argv = [sys.executable, "-m", "vllm_sim", "serve", "m", "--port", str(free_port()), *args]
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert message in done.stderr
