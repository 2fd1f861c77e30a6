"""A fleet agent's report of a completed fetch (a queued `fetched` change) becomes a passing
VerificationRun for its host, once per deployment, start token and host however often the batch is
sent; none for a cache hit; a report that cannot be true is refused and logged while the rest of the
batch applies.

The batches go to the real agent_channel.sync (PostgreSQL, Redis), through JSON as the API view hands
them on; the fetch itself is covered end to end in test_fleet_agent_fetches_from_store.py (head host)
and test_ray_member_fetches_from_store.py (member host).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest

from models_registry.models import ModelVersion, VerificationRun
from models_registry.store import manifest_of
from nodes import agent_channel
from nodes.choices import DeploymentState, DesiredState
from nodes.models import Deployment, DeploymentMember, Host
from tests.nodes.conftest import make_host

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_clean")]


@pytest.fixture
def stopped(make_deployment: Callable[..., Deployment]) -> Callable[..., Deployment]:
    """A deployment at rest (the sync has nothing to launch), with a start token of a past launch."""
    counter = iter(range(1000))

    def build(**fields: Any) -> Deployment:
        return make_deployment(
            state=DeploymentState.STOPPED,
            desired_state=DesiredState.STOPPED,
            start_token=f"token-{next(counter)}",
            **fields,
        )

    return build


def report(version: ModelVersion, **overrides: Any) -> dict[str, Any]:
    """What the agent sends after fetching every file of the version (nodes/agent/remote._fetch_files)."""
    manifest = manifest_of(version)
    now = time.time()
    return {
        "digest": version.manifest_digest,
        "files": len(manifest),
        "bytes_verified": sum(size for _, size, _ in manifest),
        "bytes_fetched": sum(size for _, size, _ in manifest),
        "resumed_files": 0,
        "cached": False,
        "started_at": now - 2.0,
        "finished_at": now,
        **overrides,
    }


def fetched(deployment: Deployment, change_id: str, **overrides: Any) -> dict[str, Any]:
    return {
        "id": change_id,
        "kind": "fetched",
        "deployment_id": deployment.pk,
        "start_token": deployment.start_token,
        "at": time.time(),
        "fetch": report(deployment.model_version, **overrides),
    }


def send(host: Host, changes: list[dict[str, Any]]) -> dict[str, Any]:
    batch = {"host": host.name, "info": {"pid": 1}, "changes": changes}
    answer = agent_channel.sync(host, json.loads(json.dumps(batch)))
    return dict(json.loads(json.dumps(answer)))


def fetch_runs() -> list[VerificationRun]:
    return list(VerificationRun.objects.filter(trigger="fetch").order_by("id"))


def test_a_reported_fetch_is_recorded_once_however_often_the_batch_is_replayed(
    host: Host, stopped: Callable[..., Deployment]
) -> None:
    deployment = stopped()
    change = fetched(deployment, "c1", started_at=1_764_560_000.0, finished_at=1_764_560_042.5)

    assert send(host, [change])["acked"] == ["c1"]
    # The answer was lost: the agent sends the same change again (and, after a restart, with a new id).
    assert send(host, [change])["acked"] == ["c1"]
    assert send(host, [{**change, "id": "c1-again"}])["acked"] == ["c1-again"]

    runs = fetch_runs()
    manifest = manifest_of(deployment.model_version)
    assert [(r.host_name, r.ok, r.files_checked, r.bytes_hashed) for r in runs] == [
        (host.name, True, len(manifest), sum(size for _, size, _ in manifest))
    ]
    assert runs[0].manifest_digest == deployment.model_version.manifest_digest
    assert runs[0].finished_at is not None
    assert (runs[0].finished_at - runs[0].started_at).total_seconds() == pytest.approx(42.5)
    assert runs[0].started_at.timestamp() == pytest.approx(1_764_560_000.0)

    # The next launch (a new start token) fetches again: a second run.
    Deployment.objects.filter(pk=deployment.pk).update(start_token="token-next")
    deployment.refresh_from_db()
    send(host, [fetched(deployment, "c2")])
    assert len(fetch_runs()) == 2


def test_a_cache_hit_records_nothing(host: Host, stopped: Callable[..., Deployment]) -> None:
    deployment = stopped()
    # Nothing read from the store: the co-located agent records nothing for it either.
    answer = send(host, [fetched(deployment, "c1", cached=True, bytes_verified=0, bytes_fetched=0)])
    assert answer["acked"] == ["c1"]
    assert fetch_runs() == []


def test_a_member_hosts_report_is_recorded_for_the_member(
    host: Host, stopped: Callable[..., Deployment]
) -> None:
    member = make_host("node-member")
    deployment = stopped(pipeline_parallel_size=2)
    DeploymentMember.objects.create(deployment=deployment, host=member, stage=1, gpu_indices=[0])

    send(member, [fetched(deployment, "m1")])
    send(host, [fetched(deployment, "h1")])

    assert sorted(r.host_name for r in fetch_runs()) == sorted([host.name, "node-member"])


BAD_REPORTS: dict[str, dict[str, Any]] = {
    "another version's digest": {"digest": "0" * 64},
    "another file count than the manifest's": {"files": 7},
    "a negative byte count": {"bytes_fetched": -1},
    "bytes as text": {"bytes_verified": "lots"},
    "fewer bytes verified than the manifest holds": {"bytes_verified": 1},
    "more files resumed than fetched": {"resumed_files": 99},
    "cached as a string": {"cached": "no"},
    "finished before it started": {"started_at": 1_764_560_100.0, "finished_at": 1_764_560_000.0},
    "no time": {"finished_at": None},
}


@pytest.mark.parametrize("overrides", BAD_REPORTS.values(), ids=BAD_REPORTS.keys())
def test_a_report_that_cannot_be_true_is_refused_and_the_rest_of_the_batch_applies(
    host: Host,
    stopped: Callable[..., Deployment],
    overrides: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    bad, good = stopped(), stopped()
    with caplog.at_level(logging.WARNING, logger="nodes.agent_channel"):
        answer = send(host, [fetched(bad, "bad", **overrides), fetched(good, "good")])

    # Acknowledged (sending it again would not make it true), logged, and nothing recorded for it.
    assert answer["acked"] == ["bad", "good"]
    assert [r.host_name for r in fetch_runs()] == [host.name]
    assert fetch_runs()[0].fetch_key == f"{good.pk}:{good.start_token}:{host.name}"
    assert f"refused the fetch report of deployment {bad.pk}" in caplog.text


def test_a_report_about_a_deployment_the_host_has_no_part_in_is_refused(
    host: Host, stopped: Callable[..., Deployment], caplog: pytest.LogCaptureFixture
) -> None:
    other = make_host("node-other")
    elsewhere = stopped(host=other)
    mine = stopped()
    gone = {**fetched(mine, "gone"), "deployment_id": 999_999}

    with caplog.at_level(logging.WARNING, logger="nodes.agent_channel"):
        answer = send(host, [fetched(elsewhere, "wrong-host"), gone, fetched(mine, "mine")])

    assert answer["acked"] == ["wrong-host", "gone", "mine"]
    assert [r.host_name for r in fetch_runs()] == [host.name]
    assert f"refused the fetch report of deployment {elsewhere.pk}: no such deployment" in caplog.text
    assert "refused the fetch report of deployment 999999: no such deployment" in caplog.text
    # The heartbeat of the same batch was recorded (with the info it carried).
    assert Host.objects.get(pk=host.pk).agent_info == {"pid": 1, "channel": "api"}
