"""The client's `response_format`, as a check of the complete answer (the schema stage's rule).

`{"type": "json_object"}` asks for a JSON object; `{"type": "json_schema", "json_schema": {"schema":
{...}}}` for JSON that matches the schema (validated by `jsonschema`, the draft the schema's `$schema`
names, 2020-12 when it names none). An answer that fails is described by jsonschema's most relevant
error (`best_match`: the first of the errors, ranked by how deep and how specific they are): its path
in the answer and its message.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from jsonschema.protocols import Validator

# jsonschema is imported on the first schema to check, not at start: it takes 0.2 s and 6 MB per
# proxy process, which only processes whose clients send a json_schema need.

# A message quotes the offending value; a long one is cut so the error stays readable.
MAX_MESSAGE_CHARS = 300


class Checker:
    """What one request's answer must be: JSON (an object for json_object), matching `validator`."""

    __slots__ = ("kind", "validator")

    def __init__(self, kind: str, validator: Validator | None) -> None:
        self.kind = kind
        self.validator = validator

    def problem(self, text: str) -> str | None:
        """None when `text` is what the client asked for, else what is wrong with it."""
        try:
            doc = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            return f"the answer is not valid JSON ({exc})"
        if self.validator is None:
            if self.kind == "json_object" and not isinstance(doc, dict):
                return f"the answer is JSON but not an object (a {type(doc).__name__})"
            return None
        from jsonschema.exceptions import best_match

        error = best_match(self.validator.iter_errors(doc))
        if error is None:
            return None
        message = error.message
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[: MAX_MESSAGE_CHARS - 3] + "..."
        return f"at {error.json_path}: {message}"


@lru_cache(maxsize=256)
def _validator(schema_json: bytes) -> Validator | None:
    """A compiled validator for one schema (clients send the same schema again and again); None for
    a schema that is not valid JSON Schema (the engine refuses those itself, before generating)."""
    from jsonschema import validators
    from jsonschema.exceptions import SchemaError

    schema = orjson.loads(schema_json)
    cls = validators.validator_for(schema, default=validators.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except SchemaError:
        return None
    validator: Validator = cls(schema)
    return validator


def checker(body: dict[str, Any]) -> Checker | None:
    """The check the request's `response_format` asks for; None when it asks for none (or for a schema
    that cannot be checked)."""
    fmt = body.get("response_format")
    if not isinstance(fmt, dict):
        return None
    kind = fmt.get("type")
    if kind == "json_object":
        return Checker("json_object", None)
    if kind != "json_schema":
        return None
    spec = fmt.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if schema is None:
        return Checker("json_schema", None)  # any JSON, as OpenAI takes a json_schema with no schema
    if not isinstance(schema, dict | bool):
        return None
    validator = _validator(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS))
    return None if validator is None else Checker("json_schema", validator)
