"""POST /sim/slowdown: the modelled hardware made slower (or faster) while the engine runs; the change
shows in how long answers take and in /sim/stats, and a bad factor is refused."""

from __future__ import annotations

import time

from tests.sim.conftest import MODEL, SimFactory
from tests.sim.http import call, call_json


def timed_completion(base_url: str) -> float:
    body = {"model": MODEL, "prompt": "hello there", "max_tokens": 40, "ignore_eos": True}
    t0 = time.perf_counter()
    status, _, _ = call(base_url + "/v1/completions", body)
    assert status == 200
    return time.perf_counter() - t0


def test_slowdown_makes_answers_slower_and_is_reported(sim_factory: SimFactory) -> None:
    sim = sim_factory("--max-model-len", "4096", time_scale=2.0)
    before = min(timed_completion(sim.base_url) for _ in range(2))
    status, body = call_json(sim.base_url + "/sim/slowdown?factor=4", method="POST")
    assert status == 200 and body == {"slowdown": 4.0}
    assert call_json(sim.base_url + "/sim/stats")[1]["slowdown"] == 4.0
    after = min(timed_completion(sim.base_url) for _ in range(2))
    assert after > 2.5 * before
    # Back to the modelled speed.
    assert call_json(sim.base_url + "/sim/slowdown?factor=1", method="POST")[0] == 200
    assert min(timed_completion(sim.base_url) for _ in range(2)) < 0.6 * after


def test_a_bad_factor_is_refused(sim_factory: SimFactory) -> None:
    sim = sim_factory("--max-model-len", "4096")
    for bad in ("0", "-1", "abc", "nan", "inf"):
        status, body = call_json(sim.base_url + f"/sim/slowdown?factor={bad}", method="POST")
        assert status == 400 and "positive" in body["error"]
    assert call_json(sim.base_url + "/sim/stats")[1]["slowdown"] == 1.0
