"""A model's relations keep the import layers: a foreign key points down, never up and never sideways.

A ForeignKey, OneToOneField or ManyToManyField is a dependency as real as an import (the migration of
the model depends on the other app's, deleting a row of the other app cascades into this one), yet
`lint-imports` cannot see it when the target is named by a string ("routing.RoutePool"). This test
applies the `layers` contract of pyproject.toml to every relation field of the project's models: the
related model's app must sit in a lower layer, or be the model's own app. Two packages in one layer
written "a | b" are independent (no relation either way); "a : b" lets them relate.

One kind of target is allowed anywhere: the user model named by a swappable setting
(settings.AUTH_USER_MODEL). A model points at "the user model, whichever app supplies it", as the
settings choose, the way the code reads `django.conf.settings` and never imports console.
GenericForeignKey has no fixed target and is not a relation field here.

The synthetic cases prove the check bites: a model built in an isolated app registry with one relation
that breaks the rule must be reported, through the same walk as the real models.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pytest
from django.apps import apps
from django.contrib.auth import get_user_model
from django.db import models
from django.db.models.fields.related import RelatedField
from django.test.utils import isolate_apps

from console.models import Tenant
from models_registry.models import ModelVersion
from nodes.models import Deployment
from routing.models import RoutePool
from tools.architecture import contracts

# Targets a relation may name from any layer: swappable models, by the setting that names them.
SWAPPABLE_TARGETS_ALLOWED = frozenset({"AUTH_USER_MODEL"})


@dataclass(frozen=True)
class Layer:
    index: int  # 0 is the top layer
    independent: bool  # siblings written "a | b": no relation between them


def layer_of_package() -> dict[str, Layer]:
    """Each package of the `layers` contract in pyproject.toml, with its layer (read, never copied)."""
    (contract,) = [c for c in contracts() if c.get("id") == "layers"]
    assert contract["type"] == "layers"
    out: dict[str, Layer] = {}
    for index, layer in enumerate(contract["layers"]):
        independent = "|" in layer
        for name in layer.replace(":", "|").split("|"):
            out[name.strip().strip("()")] = Layer(index, independent)
    return out


@dataclass(frozen=True)
class Relation:
    model: str  # app_label.Model
    field: str
    kind: str  # ForeignKey, OneToOneField, ManyToManyField, ...
    package: str  # the top-level package of the model's app
    target: str  # app_label.Model of the related model
    target_package: str
    swappable_setting: str | None

    def __str__(self) -> str:
        return f"{self.model}.{self.field} ({self.kind}) -> {self.target}"


def _package(model: type[models.Model]) -> str:
    app_config = model._meta.app_config
    assert app_config is not None
    return app_config.name.split(".")[0]


def relations(of_models: Iterable[type[models.Model]]) -> list[Relation]:
    """Every relation field declared on the models (forward ones: a reverse relation is the other's)."""
    out = []
    for model in of_models:
        for field in model._meta.get_fields():
            if not isinstance(field, RelatedField):
                continue
            target: Any = field.related_model
            out.append(
                Relation(
                    model=model._meta.label,
                    field=field.name,
                    kind=type(field).__name__,
                    package=_package(model),
                    target=target._meta.label,
                    target_package=_package(target),
                    swappable_setting=field.swappable_setting,
                )
            )
    return out


def violations(found: Iterable[Relation], layers: dict[str, Layer]) -> list[str]:
    """The relations that point to a higher layer, or to another package of an independent layer."""
    out = []
    for rel in found:
        own, other = layers.get(rel.package), layers.get(rel.target_package)
        if own is None or other is None or rel.package == rel.target_package:
            continue  # Django's own apps, third-party ones, or within one app
        if rel.swappable_setting in SWAPPABLE_TARGETS_ALLOWED:
            continue
        if other.index < own.index:
            out.append(f"{rel}: {rel.target_package} is a layer above {rel.package}")
        elif other.index == own.index and own.independent:
            out.append(f"{rel}: {rel.target_package} and {rel.package} are independent packages of one layer")
    return sorted(out)


def project_models() -> list[type[models.Model]]:
    layers = layer_of_package()
    return [m for m in apps.get_models() if _package(m) in layers]


def test_every_relation_of_the_project_points_down_the_layers() -> None:
    assert violations(relations(project_models()), layer_of_package()) == []


def test_the_walk_sees_the_relations_it_checks() -> None:
    """Not vacuous: the relations across apps are found, with their targets resolved."""
    found = {str(r) for r in relations(project_models())}
    assert "nodes.Deployment.model_version (ForeignKey) -> models_registry.ModelVersion" in found
    assert "alerts.AlertRule.pool (ForeignKey) -> routing.RoutePool" in found
    assert "routing.StageChain.tenant (ForeignKey) -> console.Tenant" in found
    assert "core.AuditEvent.actor (ForeignKey) -> console.User" in found  # allowed: swappable


def test_the_layers_come_from_the_contract() -> None:
    layers = layer_of_package()
    assert layers["inferchain"].index < layers["routing"].index < layers["nodes"].index < layers["core"].index
    assert layers["console"] == layers["models_registry"]
    assert layers["console"].independent


def _synthetic(app_label: str, field: models.Field[Any, Any]) -> list[str]:
    """The violations of one model of `app_label` that has only `field`, in an isolated registry."""
    with isolate_apps(app_label):
        meta = type("Meta", (), {"app_label": app_label})
        attrs = {"__module__": f"{app_label}.models", "target": field, "Meta": meta}
        model = type("Synthetic", (models.Model,), attrs)
        return violations(relations([model]), layer_of_package())


@pytest.mark.parametrize(
    ("app_label", "field", "wanted"),
    [
        pytest.param(
            "nodes",
            lambda: models.OneToOneField(RoutePool, on_delete=models.CASCADE, related_name="+"),
            "nodes.Synthetic.target (OneToOneField) -> routing.RoutePool: routing is a layer above nodes",
            id="nodes-to-routing-upward",
        ),
        pytest.param(
            "core",
            lambda: models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="+"),
            "core.Synthetic.target (ForeignKey) -> nodes.Deployment: nodes is a layer above core",
            id="core-to-nodes-upward",
        ),
        pytest.param(
            "core",
            lambda: models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+"),
            "core.Synthetic.target (ForeignKey) -> console.Tenant: console is a layer above core",
            id="core-to-console-not-the-user-model",
        ),
        pytest.param(
            "models_registry",
            lambda: models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+"),
            "models_registry.Synthetic.target (ForeignKey) -> console.Tenant: "
            "console and models_registry are independent packages of one layer",
            id="sideways-in-one-layer",
        ),
        pytest.param(
            "console",
            lambda: models.ManyToManyField(ModelVersion, related_name="+"),
            "console.Synthetic.target (ManyToManyField) -> models_registry.ModelVersion: "
            "models_registry and console are independent packages of one layer",
            id="many-to-many-sideways",
        ),
    ],
)
def test_a_relation_against_the_layers_is_reported(app_label: str, field: Any, wanted: str) -> None:
    assert _synthetic(app_label, field()) == [wanted]


@pytest.mark.parametrize(
    ("app_label", "field"),
    [
        pytest.param(
            "routing",
            lambda: models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="+"),
            id="routing-to-nodes-downward",
        ),
        pytest.param(
            "alerts",
            lambda: models.OneToOneField(RoutePool, on_delete=models.CASCADE, related_name="+"),
            id="alerts-to-routing-downward",
        ),
        pytest.param(
            "core",
            # The class, not the setting's string: the isolated registry resolves no string.
            lambda: models.ForeignKey(get_user_model(), on_delete=models.CASCADE, related_name="+"),
            id="the-swappable-user-model-from-the-floor",
        ),
    ],
)
def test_a_relation_down_the_layers_is_not(app_label: str, field: Any) -> None:
    assert _synthetic(app_label, field()) == []
