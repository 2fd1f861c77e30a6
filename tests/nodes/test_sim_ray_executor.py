"""The simulator's `--distributed-executor-backend ray` against a real one-node Ray cluster with one GPU:
asked for two pipeline stages (two GPU bundles), it warns as vLLM does that the cluster has fewer GPUs,
waits for its placement group, and gives up at start with vLLM's message."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from nodes.agent import ray_node
from tests.nodes.conftest import free_port

pytestmark = [pytest.mark.slow]


def test_the_simulator_fails_at_start_when_the_cluster_lacks_gpus(tmp_path: Path) -> None:
    temp_dir = tempfile.mkdtemp(prefix="icray-", dir="/tmp")
    port = free_port()
    plan: dict[str, Any] = {
        "deployment_id": 1,
        "role": "head",
        "port": port,
        "head_address": f"127.0.0.2:{port}",
        "node_ip": "127.0.0.2",
        "num_gpus": 1,
        "gpu_indices": [0],
        "object_store_memory": 80 * 1024 * 1024,
    }
    node = ray_node.start(plan, tmp_path, temp_dir=temp_dir)
    try:
        deadline = time.monotonic() + 60
        while not node.check_joined():
            assert node.alive() and time.monotonic() < deadline, Path(node.log_path).read_text()
            time.sleep(0.2)
        env = {**os.environ, "RAY_ADDRESS": str(plan["head_address"]), "VLLM_HOST_IP": "127.0.0.2"}
        argv = [
            sys.executable, "-m", "vllm_sim", "serve", "m", "--port", str(free_port()),
            "--pipeline-parallel-size", "2", "--distributed-executor-backend", "ray",
            "--sim-ray-placement-timeout", "2",
        ]  # fmt: skip
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=90)
        output = done.stdout + done.stderr
        assert done.returncode == 1, output
        assert "The number of required GPUs exceeds the total number of available GPUs" in output
        assert "Cannot provide a placement group of placement_group_specs=" in output
        assert "within 2 seconds. See `ray status` and `ray list nodes`" in output
    finally:
        ray_node.stop(node, tmp_path)
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert not ray_node.adopt(tmp_path)
