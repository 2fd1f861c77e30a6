"""GPU samples: NVML values mapped to the live record, and the plain "no NVIDIA GPU" path.

This machine has no NVIDIA GPU, so the NVML path runs against a stand-in module with NVML's
function names; the values and units (bytes, percent, milliwatts) are what NVML documents.
"""

from __future__ import annotations

import types
from typing import Any

import pytest

from nodes.agent import gpus
from nodes.agent.gpus import GpuSource, SimulatedGpuConfig


def fake_nvml() -> types.ModuleType:
    module = types.ModuleType("pynvml")
    memory = types.SimpleNamespace(total=80 * 1024**3, used=30 * 1024**3)
    module.NVML_TEMPERATURE_GPU = 0  # type: ignore[attr-defined]
    module.nvmlInit = lambda: None  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = lambda: 1  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByIndex = lambda i: f"h{i}"  # type: ignore[attr-defined]
    module.nvmlDeviceGetName = lambda h: b"NVIDIA H200"  # type: ignore[attr-defined]
    module.nvmlDeviceGetUUID = lambda h: "GPU-1234"  # type: ignore[attr-defined]
    module.nvmlDeviceGetMemoryInfo = lambda h: memory  # type: ignore[attr-defined]
    module.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=87, memory=40)  # type: ignore[attr-defined]
    module.nvmlDeviceGetTemperature = lambda h, sensor: 61  # type: ignore[attr-defined]
    module.nvmlDeviceGetPowerUsage = lambda h: 512_345  # type: ignore[attr-defined]
    return module


def test_nvml_samples_are_mapped_with_units(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpus, "pynvml", fake_nvml())
    source = GpuSource("gpu-1")
    assert source.nvml_available and not source.simulated and source.nvml_error == ""
    assert source.inventory() == [
        {
            "index": 0,
            "uuid": "GPU-1234",
            "name": "NVIDIA H200",
            "memory_total_bytes": 80 * 1024**3,
            "simulated": False,
        }
    ]
    sample = source.sample()[0]
    assert sample["utilization_pct"] == 87.0
    assert sample["memory_used_bytes"] == 30 * 1024**3
    assert sample["temperature_c"] == 61.0
    assert sample["power_watts"] == pytest.approx(512.345)
    assert sample["simulated"] is False


def test_without_nvidia_the_agent_says_so_and_models_simulated_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    broken: Any = types.ModuleType("pynvml")

    def init() -> None:
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    broken.nvmlInit = init
    monkeypatch.setattr(gpus, "pynvml", broken)
    source = GpuSource("cpu-1", SimulatedGpuConfig(count=2, memory_bytes=1000))
    assert source.simulated and source.nvml_error.startswith("No NVIDIA GPU")
    busy = {"memory_used_bytes": 400, "utilization_pct": 70, "temperature_c": 50, "power_watts": 200}
    light = {"memory_used_bytes": 900, "utilization_pct": 50, "temperature_c": 45, "power_watts": 150}
    reports = {1: [busy, light]}
    idle, shared = source.sample(reports)
    assert idle["memory_used_bytes"] == 0 and idle["simulated"] is True
    # Two simulated engines on one GPU: memory and load add up (capped), heat and power follow the busiest.
    assert shared["memory_used_bytes"] == 1000 and shared["utilization_pct"] == 100.0
    assert shared["temperature_c"] == 50 and shared["power_watts"] == 200
