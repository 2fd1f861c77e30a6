"""Simulator engines for the run tests: a reference and its twin with --sim-quality-drift, each also with
whole-vocabulary logprobs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.evals.run_helpers import DRIFT, MODEL
from vllm_sim.testing import SimHandle, start_sim


def _serve(*extra: str) -> Iterator[SimHandle]:
    handle = start_sim(MODEL, "--max-model-len", "4096", *extra, time_scale=50.0)
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture(scope="module")
def reference_sim() -> Iterator[SimHandle]:
    yield from _serve()


@pytest.fixture(scope="module")
def drifted_sim() -> Iterator[SimHandle]:
    yield from _serve("--sim-quality-drift", str(DRIFT))


# vLLM's switch for whole-vocabulary logprobs (its default caps them at 20): tests/evals/test_exact_kl.py.
@pytest.fixture(scope="module")
def whole_reference() -> Iterator[SimHandle]:
    yield from _serve("--max-logprobs", "-1")


@pytest.fixture(scope="module")
def whole_candidate() -> Iterator[SimHandle]:
    yield from _serve("--max-logprobs", "-1", "--sim-quality-drift", str(DRIFT))
