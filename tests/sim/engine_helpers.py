"""Drive a SimEngine in-process on a manual clock: every step takes exactly its modelled time."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from vllm_sim import text
from vllm_sim.engine import Sequence, SimEngine
from vllm_sim.metrics import EngineMetrics
from vllm_sim.profiles import PROFILES, derive_engine_shape


@dataclass
class ManualClock:
    """A clock the test advances by each step's modelled duration."""

    t: float = 0.0

    def __call__(self) -> float:
        return self.t


def make_engine(
    profile: str = "h100-llama3-8b-fp16", prefix_caching: bool = True, **shape_kwargs: int
) -> SimEngine:
    shape = derive_engine_shape(PROFILES[profile], **shape_kwargs)  # type: ignore[arg-type]
    metrics = EngineMetrics(shape, "m", prefix_caching, CollectorRegistry())
    return SimEngine(shape, metrics, enable_prefix_caching=prefix_caching, clock=ManualClock())


def make_seq(prompt_tokens: int, max_tokens: int, salt: int = 0, prefix: list[int] | None = None) -> Sequence:
    ids = list(prefix or []) + [1000 + (salt * 131 + i) % 50000 for i in range(prompt_tokens)]
    key = text.request_key(ids, salt)
    return Sequence(
        prompt_ids=ids, max_tokens=max_tokens, key=key, mean_len=10**9, drift=0.0, ignore_eos=True
    )


def run_to_completion(engine: SimEngine, max_steps: int = 1_000_000) -> float:
    """Step until nothing is left; returns the modelled seconds it took."""
    clock = engine.clock
    assert isinstance(clock, ManualClock)
    start = clock.t
    for _ in range(max_steps):
        if not engine.running and not engine.waiting:
            break
        plan, dt = engine.plan_step()
        assert plan.items, "scheduler made no progress"
        clock.t += dt
        engine.finish_step(plan, dt, clock.t)
    return clock.t - start


def run_steps(engine: SimEngine, steps: int) -> None:
    clock = engine.clock
    assert isinstance(clock, ManualClock)
    for _ in range(steps):
        plan, dt = engine.plan_step()
        clock.t += dt
        engine.finish_step(plan, dt, clock.t)
