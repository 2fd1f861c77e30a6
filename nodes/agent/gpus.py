"""GPU inventory and samples for the agent: NVML (nvidia-ml-py) when an NVIDIA driver is present,
otherwise simulated GPUs whose live values come from the simulator engines running on them.

Without NVML the agent says so plainly (agent_info.nvml_error) and every sample carries
`simulated: true`, so the console can mark it.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any

import pynvml

from vllm_sim.profiles import PROFILES


@dataclass(frozen=True)
class SimulatedGpuConfig:
    """Simulated GPUs an agent reports when the host has no NVIDIA GPU (demo fleet, tests)."""

    count: int = 0
    name: str = "NVIDIA H100 80GB HBM3"
    memory_bytes: int = 81559 * 1024 * 1024
    idle_power_watts: float = 70.0
    idle_temperature_c: float = 32.0


class GpuSource:
    """Reads GPUs through NVML, or models them when NVML is unavailable."""

    def __init__(self, host_name: str, simulated: SimulatedGpuConfig | None = None) -> None:
        self.host_name = host_name
        self.simulated_config = simulated or SimulatedGpuConfig()
        self.nvml_error = ""
        self._nvml: Any = None
        self._handles: list[Any] = []
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self._nvml = pynvml
        except Exception as exc:  # pynvml raises its own NVMLError subclasses
            self.nvml_error = f"No NVIDIA GPU: NVML is unavailable ({type(exc).__name__}: {exc})."

    @property
    def nvml_available(self) -> bool:
        return self._nvml is not None

    @property
    def simulated(self) -> bool:
        return not self.nvml_available

    def versions(self) -> dict[str, Any]:
        """The NVIDIA driver and the CUDA version it supports (NVML); None without NVML (simulated GPUs)."""
        if self._nvml is None:
            return {"driver_version": None, "cuda_driver_version": None}
        nv = self._nvml
        try:
            driver = name_str(nv.nvmlSystemGetDriverVersion())
            cuda = int(nv.nvmlSystemGetCudaDriverVersion())  # e.g. 12040 for CUDA 12.4
            cuda_text = f"{cuda // 1000}.{(cuda % 1000) // 10}"
        except Exception as exc:  # an old driver may lack the call
            return {"driver_version": None, "cuda_driver_version": None, "version_error": str(exc)}
        return {"driver_version": driver, "cuda_driver_version": cuda_text}

    def inventory(self) -> list[dict[str, Any]]:
        """index, uuid, name, memory_total_bytes, simulated for every GPU of the host."""
        if self._nvml is not None:
            nv = self._nvml
            gpus = []
            for index, handle in enumerate(self._handles):
                name = nv.nvmlDeviceGetName(handle)
                uuid = nv.nvmlDeviceGetUUID(handle)
                gpus.append(
                    {
                        "index": index,
                        "uuid": name_str(uuid),
                        "name": name_str(name),
                        "memory_total_bytes": int(nv.nvmlDeviceGetMemoryInfo(handle).total),
                        "simulated": False,
                    }
                )
            return gpus
        cfg = self.simulated_config
        return [
            {
                "index": i,
                "uuid": "GPU-sim-" + hashlib.sha256(f"{self.host_name}:{i}".encode()).hexdigest()[:24],
                "name": cfg.name,
                "memory_total_bytes": cfg.memory_bytes,
                "simulated": True,
            }
            for i in range(cfg.count)
        ]

    def sample(self, sim_reports: dict[int, list[dict[str, Any]]] | None = None) -> list[dict[str, Any]]:
        """One sample per GPU. `sim_reports` maps a GPU index to what simulators on it report."""
        now = time.time()
        if self._nvml is not None:
            nv = self._nvml
            samples = []
            for index, handle in enumerate(self._handles):
                memory = nv.nvmlDeviceGetMemoryInfo(handle)
                try:
                    power = nv.nvmlDeviceGetPowerUsage(handle) / 1000.0  # milliwatts
                except Exception:  # some boards do not report power
                    power = None
                samples.append(
                    {
                        "index": index,
                        "ts": now,
                        "simulated": False,
                        "utilization_pct": float(nv.nvmlDeviceGetUtilizationRates(handle).gpu),
                        "memory_used_bytes": int(memory.used),
                        "memory_total_bytes": int(memory.total),
                        "temperature_c": float(nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU)),
                        "power_watts": power,
                    }
                )
            return samples
        cfg = self.simulated_config
        reports = sim_reports or {}
        samples = []
        for gpu in self.inventory():
            index = gpu["index"]
            on_gpu = reports.get(index, [])
            total = gpu["memory_total_bytes"]
            # Several simulated engines may share one GPU: memory and load add up, heat and power
            # follow the busiest one (each engine models the board as if it were alone).
            used = sum(int(r.get("memory_used_bytes", 0)) for r in on_gpu)
            util = sum(float(r.get("utilization_pct", 0.0)) for r in on_gpu)
            samples.append(
                {
                    "index": index,
                    "ts": now,
                    "simulated": True,
                    "utilization_pct": min(100.0, util),
                    "memory_used_bytes": min(total, used),
                    "memory_total_bytes": total,
                    "temperature_c": max(
                        [float(r.get("temperature_c", 0.0)) for r in on_gpu] or [cfg.idle_temperature_c]
                    ),
                    "power_watts": max(
                        [float(r.get("power_watts", 0.0)) for r in on_gpu] or [cfg.idle_power_watts]
                    ),
                }
            )
        return samples


def name_str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def simulated_gpu_config(profile_name: str, count: int) -> SimulatedGpuConfig:
    """`count` simulated GPUs like the GPU of a simulator profile (name, memory, idle power)."""
    gpu = PROFILES[profile_name].gpu
    return SimulatedGpuConfig(
        count=count,
        name=gpu.name,
        memory_bytes=gpu.memory_bytes,
        idle_power_watts=gpu.power_idle_watts,
    )
