"""The scaling models' move from nodes to routing (nodes 0009, routing 0013) keeps every row.

Migrated back to the state before the move, a policy, its decision and an audit event are written through
the historical nodes models; migrated forward, the routing models read the same rows from the same
tables, the content type keeps its id (permissions follow it) and the audit event its object. And back.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from core.models import AuditEvent
from routing.scaling.models import ScalingDecision, ScalingPolicy

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("nodes", "0008_deployment_members"), ("routing", "0012_request_log_stages")]


def migrate(targets: list[tuple[str, str]]) -> Any:
    """Migrate nodes and routing to `targets`, the other apps to their latest; the historical models."""
    executor = MigrationExecutor(connection)
    moved = {app for app, _ in targets}
    everything = [n for n in executor.loader.graph.leaf_nodes() if n[0] not in moved] + targets
    executor.migrate(everything)
    return MigrationExecutor(connection).loader.project_state(everything).apps


def migrate_to_latest() -> None:
    """Forward past the move (nodes 0009, routing 0013) to the latest state, which the current models
    (read below) describe: a later migration of either app adds columns they select."""
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.fixture
def back_to_latest() -> Iterator[None]:
    yield
    migrate_to_latest()


def write_before_the_move(old: Any) -> int:
    host = old.get_model("nodes", "Host").objects.create(name="h1", address="127.0.0.1")
    model = old.get_model("models_registry", "Model").objects.create(name="m")
    version = old.get_model("models_registry", "ModelVersion").objects.create(
        model=model, revision="r1", source_kind="local", source_path="/x"
    )
    template = old.get_model("nodes", "Deployment").objects.create(
        name="tpl", model_version=version, host=host, port=9000, served_model_name="llama"
    )
    pool = old.get_model("routing", "RoutePool").objects.create(name="fast", alias="llama")
    policy = old.get_model("nodes", "ScalingPolicy").objects.create(
        pool=pool, template=template, min_engines=2, max_engines=6, last_reason="kept"
    )
    old.get_model("nodes", "ScalingDecision").objects.create(
        policy=policy,
        at=timezone.now(),
        interval=42,
        action="scale_up",
        reason="r",
        engines_before=1,
        engines_after=2,
        deployment=template,
    )
    old.get_model("core", "AuditEvent").objects.create(
        action="create", object_type="nodes.scalingpolicy", object_id=str(policy.pk)
    )
    return int(policy.pk)


def test_the_rows_stay_where_they_were(back_to_latest: None) -> None:
    content_type = ContentType.objects.get_for_model(ScalingPolicy).pk
    old = migrate(BEFORE)
    assert old.get_model("nodes", "ScalingPolicy")._meta.db_table == "nodes_scalingpolicy"
    assert old.get_model("contenttypes", "ContentType").objects.get(pk=content_type).app_label == "nodes"
    pk = write_before_the_move(old)

    migrate_to_latest()
    ContentType.objects.clear_cache()

    policy = ScalingPolicy.objects.select_related("pool", "template").get()
    assert (policy.pk, policy.pool.name, policy.template.name, policy.min_engines) == (pk, "fast", "tpl", 2)
    assert policy.last_reason == "kept"
    assert list(policy.decisions.values_list("interval", "deployment__name")) == [(42, "tpl")]
    assert policy.pool.scaling_policy == policy
    assert ContentType.objects.get_for_model(ScalingPolicy).pk == content_type
    assert not ContentType.objects.filter(app_label="nodes", model__startswith="scaling").exists()
    assert AuditEvent.objects.get(object_id=str(pk)).object_type == "routing.scalingpolicy"
    # The tables' sequences go on after the rows written before the move.
    later = ScalingDecision.objects.create(
        policy=policy,
        at=timezone.now(),
        interval=43,
        action="blocked",
        reason="n",
        engines_before=2,
        engines_after=2,
    )
    assert later.pk > policy.decisions.get(interval=42).pk

    old = migrate(BEFORE)
    assert old.get_model("nodes", "ScalingPolicy").objects.get().min_engines == 2
    assert old.get_model("nodes", "ScalingDecision").objects.count() == 2
    assert old.get_model("contenttypes", "ContentType").objects.get(pk=content_type).app_label == "nodes"
    assert old.get_model("core", "AuditEvent").objects.get().object_type == "nodes.scalingpolicy"
