"""Evaluation runs against two real simulator engines: metrics, resumption, cancel, one worker at a time.

The database is the real PostgreSQL and the lock and live pushes use the real Redis; the task's body
(runner.execute_run) is called directly, as a Celery worker would.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from asgiref.sync import async_to_sync
from celery.exceptions import Retry
from channels.layers import get_channel_layer

from core.redis_client import get_redis, key
from models_registry.evaluation.models import EvalRun, EvalSample, RunState
from models_registry.evaluation.runner import execute_run, run_group
from models_registry.tasks import run_evaluation
from tests.evals.run_helpers import answer_suite, make_run
from vllm_sim.testing import SimHandle, free_port

pytestmark = [pytest.mark.django_db(transaction=False), pytest.mark.usefixtures("redis_clean")]

CASES = 40


class WorkerKilled(BaseException):
    """Stands for a worker process dying midway (raised from inside the run loop)."""


def test_reference_against_itself_agrees_everywhere(reference_sim: SimHandle) -> None:
    version = answer_suite(reference_sim, CASES)
    run = make_run(version, reference_sim, reference_sim)
    assert run_evaluation(run.pk) == RunState.COMPLETED
    run.refresh_from_db()
    assert (run.done_count, run.error_count, run.attempts) == (CASES, 0, 1)
    s = run.summary
    assert s["samples"] == CASES and s["exact_match_rate"] == 1.0 and s["chrf"] == 100.0
    flips = s["flips"]
    assert flips["flips"] == 0 and flips["reference_accuracy"] == 0.5 and flips["accuracy_difference"] == 0.0
    forced = s["distributions"]["teacher_forced"]
    assert forced["mean_kl"] == 0.0 and forced["top1_agreement"] == 1.0 and forced["samples"] == CASES
    assert run.teacher_forcing_note == ""
    for side in ("reference", "candidate"):
        assert s[side]["latency_ms"]["p50"] > 0 and s[side]["tokens_per_s"]["mean"] > 0
        assert 0 < s[side]["ttft_ms"]["p50"] <= s[side]["latency_ms"]["p50"]
    samples = list(run.samples.all())
    assert len(samples) == CASES
    assert all(x.first_divergence is None and x.flip == "" and x.kl_mode == "teacher_forced" for x in samples)
    assert all(len(x.reference_tokens) == len(x.reference_token_logprobs) > 0 for x in samples)
    assert all(0 < (x.candidate_ttft_ms or 0) <= (x.candidate_latency_ms or 0) for x in samples)


def test_drifted_candidate_flips_and_diverges(reference_sim: SimHandle, drifted_sim: SimHandle) -> None:
    version = answer_suite(reference_sim, CASES)
    run = make_run(version, reference_sim, drifted_sim)
    assert execute_run(run.pk) is not None
    run.refresh_from_db()
    assert run.state == RunState.COMPLETED and run.done_count == CASES
    s = run.summary
    flips = s["flips"]
    # The reference is right on the even half exactly (its own first token), wrong on the odd half.
    assert flips["reference_accuracy"] == 0.5 and flips["n"] == CASES
    assert flips["right_to_wrong"] >= 1 and flips["wrong_to_right"] >= 1  # ~F of each half: 4 expected
    assert flips["flips"] <= 20
    low, high = flips["difference_ci"]
    assert low <= flips["accuracy_difference"] <= high
    forced = s["distributions"]["teacher_forced"]
    assert 0.05 < forced["mean_kl"] < 0.6  # ~1.25 x F nats
    assert 0.6 < forced["top1_agreement"] < 0.95  # ~1 - F
    assert s["exact_match_rate"] < 1.0 and s["chrf"] < 100.0
    # Each flip is where the sample says: right->wrong only on even cases, wrong->right only on odd ones.
    for sample in run.samples.exclude(flip=""):
        assert sample.tags == (["even"] if sample.flip == "right_to_wrong" else ["odd"])
        assert sample.first_divergence == 0
    differing = run.samples.filter(exact_match=False)
    assert differing.exists() and all(x.first_divergence is not None for x in differing)
    assert all(
        x.mean_kl is not None and len(x.position_kl) == len(x.reference_tokens) for x in run.samples.all()
    )


def test_a_killed_worker_resumes_with_only_the_missing_cases(
    reference_sim: SimHandle, drifted_sim: SimHandle
) -> None:
    version = answer_suite(reference_sim, CASES)
    run = make_run(version, reference_sim, drifted_sim, concurrency=4)
    stored: list[int] = []

    def die_after_ten(sample: EvalSample) -> None:
        stored.append(sample.case_id)
        if len(stored) == 10:
            raise WorkerKilled

    with pytest.raises(WorkerKilled):
        execute_run(run.pk, after_sample=die_after_ten)
    run.refresh_from_db()
    assert run.state == RunState.RUNNING and run.samples.count() == 10
    # Two samples of the dead worker are lost as well (e.g. its transaction never committed).
    lost = list(run.samples.order_by("position")[:2].values_list("case_id", flat=True))
    run.samples.filter(case_id__in=lost).delete()

    again: list[int] = []
    execute_run(run.pk, after_sample=lambda s: again.append(s.case_id))
    run.refresh_from_db()
    assert run.state == RunState.COMPLETED and run.attempts == 2
    assert len(again) == CASES - 8 and set(lost) <= set(again)
    assert not set(again) & (set(stored) - set(lost))  # nothing that was kept ran twice
    case_ids = list(run.samples.values_list("case_id", flat=True))
    assert len(case_ids) == len(set(case_ids)) == CASES == run.done_count
    # A third delivery of the task finds the run finished and does nothing.
    assert run_evaluation(run.pk) == RunState.COMPLETED
    assert EvalRun.objects.get(pk=run.pk).attempts == 2


def test_a_second_delivery_while_a_worker_holds_the_run_does_nothing(
    reference_sim: SimHandle,
) -> None:
    version = answer_suite(reference_sim, 4)
    run = make_run(version, reference_sim, reference_sim)
    lock = get_redis().lock(key("eval", "run", str(run.pk)), timeout=30)
    assert lock.acquire(blocking=False)
    try:
        assert execute_run(run.pk) is None
        # The task asks Celery to try again once the holder's lock could have lapsed.
        with pytest.raises(Retry):
            run_evaluation(run.pk)
    finally:
        lock.release()
    run.refresh_from_db()
    assert run.state == RunState.PENDING and run.samples.count() == 0


def test_cancel_between_cases(reference_sim: SimHandle, drifted_sim: SimHandle) -> None:
    version = answer_suite(reference_sim, CASES)
    run = make_run(version, reference_sim, drifted_sim, concurrency=2)
    seen: list[Any] = []

    def cancel_after_three(sample: EvalSample) -> None:
        seen.append(sample)
        if len(seen) == 3:
            EvalRun.objects.filter(pk=run.pk).update(cancel_requested=True)

    execute_run(run.pk, after_sample=cancel_after_three)
    run.refresh_from_db()
    assert run.state == RunState.CANCELLED and run.finished_at is not None
    assert run.samples.count() == 3 == run.done_count
    assert run.summary["samples"] == 3
    # A cancelled run stays cancelled when its task is delivered again.
    assert run_evaluation(run.pk) == RunState.CANCELLED
    assert run.samples.count() == 3


def test_cancelled_before_start_runs_nothing(reference_sim: SimHandle) -> None:
    version = answer_suite(reference_sim, 4)
    run = make_run(version, reference_sim, reference_sim, cancel_requested=True)
    assert run_evaluation(run.pk) == RunState.CANCELLED
    assert EvalSample.objects.filter(run=run).count() == 0


def test_an_unreachable_side_is_stored_as_errors_not_lost(reference_sim: SimHandle) -> None:
    version = answer_suite(reference_sim, 3)
    run = make_run(version, reference_sim, reference_sim)
    EvalRun.objects.filter(pk=run.pk).update(candidate_base_url="http://127.0.0.1:9", request_timeout=2)
    # Stored, every one, and the run ends failed: it scored nothing, so it cannot pass for a result.
    assert run_evaluation(run.pk) == RunState.FAILED
    run.refresh_from_db()
    assert run.error_count == 3 == run.summary["errors"] and run.summary["samples"] == 0
    assert run.error.startswith("All 3 samples failed")
    assert all("ClientConnectorError" in s.error for s in run.samples.all())


def test_progress_is_pushed_to_the_run_group(reference_sim: SimHandle) -> None:
    version = answer_suite(reference_sim, 6)
    run = make_run(version, reference_sim, reference_sim)
    layer = get_channel_layer()
    assert layer is not None
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(run_group(run.pk), channel)
    execute_run(run.pk)
    events = []
    while True:
        try:
            message = async_to_sync(asyncio.wait_for)(layer.receive(channel), 2)
        except TimeoutError:
            break
        events.append(message["event"])
        if events[-1]["state"] == RunState.COMPLETED:
            break
    assert events and all(e["type"] == "eval_run.progress" and e["run"] == run.pk for e in events)
    assert events[0]["state"] == RunState.RUNNING and events[0]["total"] == 6
    last = events[-1]
    assert last["state"] == RunState.COMPLETED and last["done"] == 6
    assert last["summary"]["samples"] == 6 and last["summary"]["exact_match_rate"] == 1.0


class RefusePromptLogprobs:
    """A loopback front for an engine that cannot score a given text: prompt_logprobs answer 400."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.port = free_port()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if "prompt_logprobs" in body:
            return web.json_response(
                {"error": {"message": "prompt_logprobs is not supported", "type": "BadRequestError"}},
                status=400,
            )
        async with (
            aiohttp.ClientSession() as session,
            session.post(self.upstream + request.path, json=body) as upstream,
        ):
            out = web.StreamResponse(status=upstream.status, headers={"Content-Type": upstream.content_type})
            await out.prepare(request)
            async for chunk in upstream.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out

    def serve(self, ready: threading.Event, stop: threading.Event) -> None:
        async def main() -> None:
            app = web.Application()
            app.router.add_post("/v1/{tail:.*}", self.handle)
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.port).start()
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.05)
            await runner.cleanup()

        asyncio.run(main())


def test_without_teacher_forcing_the_kl_is_free_running_and_labelled(
    reference_sim: SimHandle, drifted_sim: SimHandle
) -> None:
    front = RefusePromptLogprobs(drifted_sim.base_url)
    ready, stop = threading.Event(), threading.Event()
    thread = threading.Thread(target=front.serve, args=(ready, stop), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        version = answer_suite(reference_sim, 12)
        run = make_run(version, reference_sim, drifted_sim)
        EvalRun.objects.filter(pk=run.pk).update(candidate_base_url=f"http://127.0.0.1:{front.port}")
        assert run_evaluation(run.pk) == RunState.COMPLETED
    finally:
        stop.set()
        thread.join(10)
    run.refresh_from_db()
    assert "refused prompt_logprobs (HTTP 400: prompt_logprobs is not supported)" in run.teacher_forcing_note
    assert set(run.summary["distributions"]) == {"free_running_topk"}
    free = run.summary["distributions"]["free_running_topk"]
    assert free["samples"] == 12 and free["mean_kl"] > 0
    for sample in run.samples.all():
        assert sample.kl_mode == "free_running_topk" and sample.error == ""
        # Only the positions up to the first divergence count, where both sides saw the same text.
        limit = (
            len(sample.reference_tokens) if sample.first_divergence is None else sample.first_divergence + 1
        )
        assert len(sample.position_kl) == min(
            limit, len(sample.reference_tokens), len(sample.candidate_tokens)
        )
