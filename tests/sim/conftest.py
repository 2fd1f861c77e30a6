"""Fixtures that launch the simulator as a real subprocess on a free loopback port."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from vllm_sim.testing import SimHandle, start_sim

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
API_KEY = "sk-sim-test-key"

SimFactory = Callable[..., SimHandle]


@pytest.fixture
def sim_factory() -> Iterator[SimFactory]:
    """Start simulators with any arguments; every one is stopped at teardown."""
    started: list[SimHandle] = []

    def factory(*args: str, **kwargs: object) -> SimHandle:
        kwargs.setdefault("time_scale", 10.0)
        handle = start_sim(kwargs.pop("model", MODEL), *args, **kwargs)  # type: ignore[arg-type]
        started.append(handle)
        return handle

    yield factory
    for handle in started:
        handle.stop()


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    """One shared simulator (H100 + Llama-3.1-8B profile, 4096 context, 10x faster than real time)."""
    handle = start_sim(
        MODEL, "--max-model-len", "4096", "--served-model-name", MODEL, "llama-8b", time_scale=10.0
    )
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def keyed_sim() -> Iterator[SimHandle]:
    """A simulator started with --api-key."""
    handle = start_sim(MODEL, "--max-model-len", "4096", api_key=API_KEY, time_scale=10.0)
    yield handle
    handle.stop()
