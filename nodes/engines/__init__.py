"""Engine adapters, one module per engine, all with the same interface (see base.EngineAdapter)."""

from __future__ import annotations

from typing import cast

from nodes.engines import llamacpp, sim, vllm
from nodes.engines.base import EngineAdapter, EngineSpec

ADAPTERS: dict[str, EngineAdapter] = {
    "vllm": cast(EngineAdapter, vllm),
    "llamacpp": cast(EngineAdapter, llamacpp),
    "sim": cast(EngineAdapter, sim),
}


def get_adapter(engine: str) -> EngineAdapter:
    try:
        return ADAPTERS[engine]
    except KeyError:
        raise ValueError(f"Unknown engine {engine!r}; expected one of {sorted(ADAPTERS)}") from None


__all__ = ["ADAPTERS", "EngineAdapter", "EngineSpec", "get_adapter"]
