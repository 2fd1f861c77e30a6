"""Simulator engines for the run tests: one reference and its twin with --sim-quality-drift."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.evals.run_helpers import DRIFT, MODEL
from vllm_sim.testing import SimHandle, start_sim


@pytest.fixture(scope="module")
def reference_sim() -> Iterator[SimHandle]:
    handle = start_sim(MODEL, "--max-model-len", "4096", time_scale=50.0)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def drifted_sim() -> Iterator[SimHandle]:
    handle = start_sim(MODEL, "--max-model-len", "4096", "--sim-quality-drift", str(DRIFT), time_scale=50.0)
    yield handle
    handle.stop()
