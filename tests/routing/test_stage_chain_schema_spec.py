"""The schema stage's JSON form: a check of the answer belongs after the generate step, and its one
option is a boolean; the response_format rule itself on answers (no proxy needed)."""

from __future__ import annotations

import re

import pytest

from routing.proxy import responseformat
from routing.proxy.stagespec import ChainError, parse_stages, split


def test_a_schema_stage_before_generation_is_refused_with_the_reason() -> None:
    stages = parse_stages([{"kind": "schema", "name": "check"}, {"kind": "generate"}])
    with pytest.raises(ChainError, match="schema stage 'check' comes before the generate step"):
        split(stages)
    pre, _, post = split(parse_stages([{"kind": "generate"}, {"kind": "schema", "config": {"hold": True}}]))
    assert pre == [] and [s.kind for s in post] == ["schema"]


@pytest.mark.parametrize(
    ("config", "reason"),
    [({"hold": "yes"}, "config.hold must be true or false"), ({"strict": True}, "unknown keys ['strict']")],
)
def test_bad_schema_config_is_refused(config: dict[str, object], reason: str) -> None:
    with pytest.raises(ChainError, match=re.escape(reason)):
        parse_stages([{"kind": "generate"}, {"kind": "schema", "config": config}])


def test_the_first_validation_error_names_its_path() -> None:
    schema = {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "integer"}}}}
    check = responseformat.checker(
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    )
    assert check is not None
    assert check.problem('{"items": [1, 2]}') is None
    assert check.problem('{"items": [1, "two"]}') == "at $.items[1]: 'two' is not of type 'integer'"
    assert responseformat.checker({"response_format": {"type": "text"}}) is None
    assert responseformat.checker({}) is None
    # A schema that is not JSON Schema is the engine's to refuse (before it generates): no check here.
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}
    assert responseformat.checker({"response_format": bad}) is None
