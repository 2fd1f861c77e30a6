"""Suite import and export as JSONL, version copies, and the suites shipped with inferchain.

One case per line (docs/evaluations.md, "Suites"):

    {"id": "capital-france", "prompt": "What is the capital of France?", "expected": "(?i)\\bparis\\b",
     "match_rule": "regex", "tags": ["geography"]}

An upload is checked whole before anything is written: every line's problems are collected with their
line numbers, and if there is any, SuiteImportError carries them all and the database is untouched.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from django.db import transaction
from django.db.models import Max

from core.audit import record_audit
from core.choices import AuditAction
from models_registry.evaluation.models import EvalCase, EvalSuite, EvalSuiteVersion
from models_registry.evaluation.rules import MATCH_RULES, check_expected

BUILTIN_DIR = Path(__file__).resolve().parent / "suites"
FIELDS = ("id", "prompt", "messages", "expected", "match_rule", "tags")
ROLES = ("system", "user", "assistant")
MAX_CASES = 10_000
MAX_BYTES = 10 * 1024 * 1024
MAX_ERRORS_SHOWN = 100
MAX_ID_LENGTH = 200
MAX_TAG_LENGTH = 50

Actor = AbstractBaseUser | AnonymousUser | None


@dataclass(frozen=True)
class LineError:
    line: int  # 1-based line number in the file (0: the file as a whole)
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {"line": self.line, "message": self.message}

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}" if self.line else self.message


class SuiteImportError(Exception):
    """A refused upload: every problem found, each with its line number; nothing was written."""

    def __init__(self, errors: list[LineError]) -> None:
        self.errors = errors
        shown = "; ".join(str(e) for e in errors[:5])
        more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
        super().__init__(f"{len(errors)} problem(s): {shown}{more}")


@dataclass(frozen=True)
class CaseData:
    """One validated case, as it will be stored."""

    case_id: str
    prompt: str
    messages: list[dict[str, str]] | None
    expected: str | None
    match_rule: str
    tags: list[str]

    def as_json(self) -> dict[str, Any]:
        """The case's JSONL object: the same keys an upload uses, unset ones left out."""
        out: dict[str, Any] = {"id": self.case_id}
        if self.messages is not None:
            out["messages"] = self.messages
        else:
            out["prompt"] = self.prompt
        if self.expected is not None:
            out["expected"] = self.expected
            out["match_rule"] = self.match_rule
        if self.tags:
            out["tags"] = self.tags
        return out


Problem = tuple[str, str]  # (field, message); field "non_field_errors" for the case as a whole


def validate_case(obj: Any) -> tuple[CaseData | None, list[Problem]]:
    """One case object checked field by field; returns the case, or what is wrong with it per field.

    The same rules serve JSONL uploads (reported per line) and single-case edits through the API
    (reported per field).
    """
    if not isinstance(obj, dict):
        return None, [("non_field_errors", f"A case is a JSON object, not {type(obj).__name__}.")]
    problems: list[Problem] = []
    unknown = sorted(set(obj) - set(FIELDS))
    for name in unknown:
        problems.append((name, f"Unknown field {name!r}; a case has {', '.join(FIELDS)}."))
    raw_id = obj.get("id")
    case_id = ""
    if isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)) or not str(raw_id).strip():
        problems.append(("id", 'Missing "id": each case needs a unique id (a string).'))
    else:
        case_id = str(raw_id).strip()
        if len(case_id) > MAX_ID_LENGTH:
            problems.append(("id", f'"id" is longer than {MAX_ID_LENGTH} characters.'))
    prompt = obj.get("prompt")
    messages = obj.get("messages")
    clean_messages: list[dict[str, str]] | None = None
    if prompt is None and messages is None:
        problems.append(
            ("prompt", 'Missing prompt: give "prompt" (a string) or "messages" (a list of chat messages).')
        )
    elif prompt is not None and messages is not None:
        problems.append(("prompt", 'Give either "prompt" or "messages", not both.'))
    elif prompt is not None and (not isinstance(prompt, str) or not prompt.strip()):
        problems.append(("prompt", '"prompt" must be a non-empty string.'))
    elif messages is not None:
        clean_messages, why = _validate_messages(messages)
        if why:
            problems.append(("messages", why))
    expected = obj.get("expected")
    rule = obj.get("match_rule")
    if expected is not None:
        if isinstance(expected, bool) or not isinstance(expected, (str, int, float)):
            problems.append(("expected", '"expected" must be a string (or a number).'))
            expected = None
        else:
            expected = str(expected)
        if rule is None:
            problems.append(
                ("match_rule", f'"expected" needs a "match_rule": one of {", ".join(MATCH_RULES)}.')
            )
        elif rule not in MATCH_RULES:
            problems.append(
                ("match_rule", f"Unknown match rule {rule!r}; use one of {', '.join(MATCH_RULES)}.")
            )
        elif expected is not None:
            why = check_expected(expected, rule)
            if why:
                problems.append(("expected", f'"expected" does not suit rule {rule}: {why}'))
    elif rule is not None:
        problems.append(
            ("match_rule", '"match_rule" without "expected": add the expected answer or drop the rule.')
        )
    tags = obj.get("tags", [])
    clean_tags: list[str] = []
    if not isinstance(tags, list) or not all(isinstance(t, str) and t.strip() for t in tags):
        problems.append(("tags", '"tags" must be a list of non-empty strings.'))
    else:
        clean_tags = [t.strip() for t in tags]
        if any(len(t) > MAX_TAG_LENGTH for t in clean_tags):
            problems.append(("tags", f"A tag is longer than {MAX_TAG_LENGTH} characters."))
        if len(set(clean_tags)) != len(clean_tags):
            problems.append(("tags", "A tag is listed twice."))
    if problems:
        return None, problems
    return (
        CaseData(
            case_id=case_id,
            prompt=str(prompt) if clean_messages is None else "",
            messages=clean_messages,
            expected=expected,
            match_rule=str(rule) if expected is not None else "",
            tags=clean_tags,
        ),
        [],
    )


def _validate_messages(messages: Any) -> tuple[list[dict[str, str]] | None, str | None]:
    if not isinstance(messages, list) or not messages:
        return None, '"messages" must be a non-empty list of {"role", "content"} objects.'
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or set(m) - {"role", "content"}:
            return None, f'messages[{i}] must be an object with "role" and "content" only.'
        if m.get("role") not in ROLES:
            return None, f"messages[{i}].role must be one of {', '.join(ROLES)}."
        if not isinstance(m.get("content"), str):
            return None, f"messages[{i}].content must be a string."
        out.append({"role": m["role"], "content": m["content"]})
    if out[-1]["role"] != "user":
        return None, 'The last of "messages" must be a user message (the model answers it).'
    return out, None


def parse_jsonl(data: str | bytes) -> list[CaseData]:
    """Every case of a JSONL text, or SuiteImportError with each problem and its line number.

    Blank lines are skipped. Problems: invalid JSON, a line that is not an object, unknown fields,
    missing id, missing prompt, unknown match rule, an expected answer that does not suit its rule,
    bad tags, an id used twice, no case at all, too many cases or bytes.
    """
    if isinstance(data, bytes):
        if len(data) > MAX_BYTES:
            raise SuiteImportError([LineError(0, f"The file is larger than {MAX_BYTES // 1024**2} MiB.")])
        try:
            data = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise SuiteImportError([LineError(0, f"The file is not UTF-8 text ({exc.reason}).")]) from None
    elif len(data.encode()) > MAX_BYTES:
        raise SuiteImportError([LineError(0, f"The file is larger than {MAX_BYTES // 1024**2} MiB.")])
    errors: list[LineError] = []
    cases: list[CaseData] = []
    first_line: dict[str, int] = {}
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            errors.append(LineError(number, f"Invalid JSON: {exc.msg} (column {exc.colno})."))
            continue
        case, problems = validate_case(obj)
        errors.extend(LineError(number, message) for _, message in problems)
        if case is None:
            continue
        if case.case_id in first_line:
            errors.append(
                LineError(
                    number, f"Duplicate id {case.case_id!r} (first used on line {first_line[case.case_id]})."
                )
            )
            continue
        first_line[case.case_id] = number
        cases.append(case)
    if not errors and not cases:
        errors.append(LineError(0, "The file holds no case (one JSON object per line)."))
    if len(cases) > MAX_CASES:
        errors.append(LineError(0, f"The file holds {len(cases)} cases; the limit is {MAX_CASES}."))
    if errors:
        raise SuiteImportError(errors)
    return cases


def cases_digest(cases: Iterable[CaseData]) -> str:
    """sha256 over the canonical JSONL of the cases (sorted keys, compact): identifies a version's content."""
    h = hashlib.sha256()
    for case in cases:
        h.update(json.dumps(case.as_json(), sort_keys=True, separators=(",", ":")).encode())
        h.update(b"\n")
    return h.hexdigest()


def case_data(case: EvalCase) -> CaseData:
    return CaseData(
        case_id=case.case_id,
        prompt=case.prompt,
        messages=case.messages,
        expected=case.expected,
        match_rule=case.match_rule,
        tags=list(case.tags),
    )


def export_jsonl(version: EvalSuiteVersion) -> str:
    """The version's cases as JSONL, in suite order; importing it again gives the same digest."""
    return "".join(
        json.dumps(case_data(c).as_json(), ensure_ascii=False) + "\n"
        for c in version.cases.order_by("position")
    )


def _version_snapshot(version: EvalSuiteVersion) -> dict[str, Any]:
    return {
        "suite": version.suite.name,
        "number": version.number,
        "case_count": version.case_count,
        "digest": version.digest,
        "source": version.source,
        "note": version.note,
    }


def create_version(
    suite: EvalSuite, cases: list[CaseData], *, note: str = "", source: str = "upload", actor: Actor = None
) -> EvalSuiteVersion:
    """A new numbered version of the suite holding these (already validated) cases, all or nothing."""
    with transaction.atomic():
        # Lock the suite row so two uploads at once cannot take the same number.
        EvalSuite.objects.select_for_update().filter(pk=suite.pk).first()
        last = suite.versions.aggregate(last=Max("number"))["last"] or 0
        version = EvalSuiteVersion.objects.create(
            suite=suite,
            number=last + 1,
            note=note,
            source=source,
            case_count=len(cases),
            digest=cases_digest(cases),
            created_by_id=actor.pk if isinstance(actor, AbstractBaseUser) else None,
        )
        EvalCase.objects.bulk_create(
            EvalCase(
                version=version,
                case_id=c.case_id,
                position=i,
                prompt=c.prompt,
                messages=c.messages,
                expected=c.expected,
                match_rule=c.match_rule,
                tags=c.tags,
            )
            for i, c in enumerate(cases)
        )
        record_audit(actor=actor, action=AuditAction.CREATE, obj=version, after=_version_snapshot(version))
    return version


def import_jsonl(
    suite: EvalSuite, data: str | bytes, *, note: str = "", actor: Actor = None
) -> EvalSuiteVersion:
    """Validate a whole JSONL upload, then store it as the next version (or raise and write nothing)."""
    return create_version(suite, parse_jsonl(data), note=note, source="upload", actor=actor)


def import_new_suite(
    name: str, data: str | bytes, *, description: str = "", note: str = "", actor: Actor = None
) -> EvalSuite:
    """A new suite whose first version is a JSONL upload: both or neither (SuiteImportError writes nothing).

    The file is checked before the suite row exists, so a refused upload leaves no empty suite behind.
    """
    cases = parse_jsonl(data)
    with transaction.atomic():
        suite = EvalSuite.objects.create(
            name=name,
            description=description,
            created_by_id=actor.pk if isinstance(actor, AbstractBaseUser) else None,
        )
        record_audit(
            actor=actor,
            action=AuditAction.CREATE,
            obj=suite,
            after={"name": suite.name, "description": suite.description},
        )
        create_version(suite, cases, note=note, source="upload", actor=actor)
    return suite


def copy_version(version: EvalSuiteVersion, *, note: str = "", actor: Actor = None) -> EvalSuiteVersion:
    """A new draft version with the same cases (how a used, frozen version is changed)."""
    cases = [case_data(c) for c in version.cases.order_by("position")]
    return create_version(
        version.suite, cases, note=note or f"Copy of v{version.number}", source="copy", actor=actor
    )


def refresh_version(version: EvalSuiteVersion) -> None:
    """Recount and re-digest a draft version after its cases were edited one by one."""
    cases = [case_data(c) for c in version.cases.order_by("position")]
    version.case_count = len(cases)
    version.digest = cases_digest(cases)
    version.save(update_fields=["case_count", "digest"])


def case_fields(case: CaseData) -> Mapping[str, Any]:
    """The model fields of a validated case (for edits through the API)."""
    return {
        "case_id": case.case_id,
        "prompt": case.prompt,
        "messages": case.messages,
        "expected": case.expected,
        "match_rule": case.match_rule,
        "tags": case.tags,
    }


# -- the suites shipped with inferchain -------------------------------------------------------------------

BUILTIN_DESCRIPTIONS = {
    "basic-facts": "Short factual questions (geography, science, history) with one-word or letter answers.",
    "arithmetic": "Small arithmetic questions (the four operations, percentages) with numeric answers.",
}


def seed_builtin_suites(directory: Path = BUILTIN_DIR) -> list[EvalSuiteVersion]:
    """Load every suites/*.jsonl as a built-in suite; idempotent.

    A suite whose latest version already has the file's digest is left alone; a changed file adds a new
    version (older ones stay, runs may use them). Returns the versions created (empty on a re-run).
    """
    created = []
    for path in sorted(directory.glob("*.jsonl")):
        cases = parse_jsonl(path.read_bytes())
        digest = cases_digest(cases)
        suite, _ = EvalSuite.objects.get_or_create(
            name=path.stem,
            defaults={"builtin": True, "description": BUILTIN_DESCRIPTIONS.get(path.stem, "")},
        )
        latest = suite.versions.order_by("-number").first()
        if latest is not None and latest.digest == digest:
            continue
        created.append(create_version(suite, cases, note=f"Shipped {path.name}", source="builtin"))
    return created
