"""Suite versions from JSONL: a bad upload is refused whole with line numbers, a used version is frozen,
and the shipped suites load idempotently."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.models import AuditEvent
from models_registry.evaluation.models import EvalCase, EvalSuite, EvalSuiteVersion, SuiteVersionLocked
from models_registry.evaluation.rules import answer_matches
from models_registry.evaluation.suites import (
    BUILTIN_DIR,
    SuiteImportError,
    cases_digest,
    copy_version,
    export_jsonl,
    import_jsonl,
    parse_jsonl,
    seed_builtin_suites,
)

pytestmark = pytest.mark.django_db

GOOD = "\n".join(
    json.dumps(obj)
    for obj in [
        {"id": "q1", "prompt": "What is 2 + 2?", "expected": "4", "match_rule": "numeric", "tags": ["math"]},
        {
            "id": "q2",
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        },
        {"id": "q3", "prompt": "Capital of France?", "expected": "(?i)paris", "match_rule": "regex"},
    ]
)


def test_a_good_upload_becomes_version_1_then_2() -> None:
    suite = EvalSuite.objects.create(name="mine")
    v1 = import_jsonl(suite, GOOD, note="first")
    assert (v1.number, v1.case_count, v1.source, v1.locked) == (1, 3, "upload", False)
    cases = list(v1.cases.order_by("position"))
    assert [c.case_id for c in cases] == ["q1", "q2", "q3"]
    assert cases[0].expected == "4" and cases[0].match_rule == "numeric" and cases[0].tags == ["math"]
    assert cases[1].prompt == "" and cases[1].chat_messages()[0] == {"role": "system", "content": "Be brief."}
    assert cases[1].expected is None and cases[1].match_rule == ""
    assert cases[2].chat_messages() == [{"role": "user", "content": "Capital of France?"}]
    v2 = import_jsonl(suite, GOOD + "\n")
    assert v2.number == 2 and v2.digest == v1.digest
    assert AuditEvent.objects.filter(object_type="models_registry.evalsuiteversion").count() == 2


def test_a_bad_upload_is_refused_whole_with_line_numbers() -> None:
    suite = EvalSuite.objects.create(name="mine")
    lines = [
        json.dumps({"id": "ok-1", "prompt": "fine"}),  # 1
        '{"id": "broken", "prompt": "no closing brace"',  # 2: invalid JSON
        json.dumps({"id": "no-prompt", "expected": "x", "match_rule": "exact"}),  # 3: missing prompt
        json.dumps({"id": "bad-rule", "prompt": "p", "expected": "x", "match_rule": "fuzzy"}),  # 4
        json.dumps({"id": "ok-1", "prompt": "again"}),  # 5: duplicate id
        "",  # 6: blank lines are skipped
        json.dumps({"id": "ok-2", "prompt": "fine too"}),  # 7
    ]
    with pytest.raises(SuiteImportError) as caught:
        import_jsonl(suite, "\n".join(lines))
    by_line = {e.line: e.message for e in caught.value.errors}
    assert sorted(by_line) == [2, 3, 4, 5]
    assert by_line[2].startswith("Invalid JSON")
    assert "Missing prompt" in by_line[3]
    assert "Unknown match rule 'fuzzy'" in by_line[4]
    assert "Duplicate id 'ok-1' (first used on line 1)" in by_line[5]
    assert len(caught.value.errors) == 4
    # Nothing was written: no version, no case, no audit event.
    assert EvalSuiteVersion.objects.count() == 0
    assert EvalCase.objects.count() == 0
    assert AuditEvent.objects.count() == 0


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ("[1, 2]", "A case is a JSON object"),
        ('{"prompt": "no id"}', 'Missing "id"'),
        ('{"id": "x", "prompt": "p", "answer": "y"}', "Unknown field 'answer'"),
        ('{"id": "x", "prompt": "p", "messages": [{"role": "user", "content": "q"}]}', "not both"),
        ('{"id": "x", "prompt": "   "}', "non-empty string"),
        ('{"id": "x", "messages": [{"role": "robot", "content": "q"}]}', "role must be one of"),
        (
            '{"id": "x", "messages": [{"role": "user", "content": "q"}, '
            '{"role": "assistant", "content": "a"}]}',
            "must be a user message",
        ),
        ('{"id": "x", "prompt": "p", "expected": "y"}', 'needs a "match_rule"'),
        ('{"id": "x", "prompt": "p", "match_rule": "exact"}', 'without "expected"'),
        (
            '{"id": "x", "prompt": "p", "expected": "([a-", "match_rule": "regex"}',
            "Invalid regular expression",
        ),
        ('{"id": "x", "prompt": "p", "expected": "seven", "match_rule": "numeric"}', "must contain a number"),
        ('{"id": "x", "prompt": "p", "expected": "AB", "match_rule": "choice"}', "one option letter"),
        ('{"id": "x", "prompt": "p", "tags": "math"}', '"tags" must be a list'),
        ('{"id": "x", "prompt": "p", "tags": ["a", "a"]}', "listed twice"),
    ],
)
def test_each_kind_of_bad_line(line: str, fragment: str) -> None:
    with pytest.raises(SuiteImportError) as caught:
        parse_jsonl(json.dumps({"id": "fine", "prompt": "fine"}) + "\n" + line)
    assert [e.line for e in caught.value.errors] == [2]
    assert fragment in caught.value.errors[0].message, caught.value.errors[0].message


def test_empty_and_non_utf8_files() -> None:
    with pytest.raises(SuiteImportError, match="holds no case"):
        parse_jsonl("\n\n")
    with pytest.raises(SuiteImportError, match="not UTF-8"):
        parse_jsonl(b"\xff\xfe{}")


def test_a_used_version_is_frozen() -> None:
    suite = EvalSuite.objects.create(name="mine")
    version = import_jsonl(suite, GOOD)
    case = version.cases.get(case_id="q1")
    case.prompt = "edited while a draft"
    case.save()
    version.lock()  # what a run does when it starts on this version
    assert version.locked and version.locked_at is not None
    first_lock = version.locked_at
    version.lock()
    assert version.locked_at == first_lock
    case.refresh_from_db()
    case.prompt = "edited after a run"
    with pytest.raises(SuiteVersionLocked, match="copy it into a new version"):
        case.save()
    with pytest.raises(SuiteVersionLocked):
        case.delete()
    with pytest.raises(SuiteVersionLocked):
        EvalCase(version=version, case_id="new", prompt="p").save()
    stale = EvalSuiteVersion.objects.get(pk=version.pk)
    stale.note = "changed"
    with pytest.raises(SuiteVersionLocked):
        stale.save()
    with pytest.raises(SuiteVersionLocked):
        stale.delete()
    assert version.cases.get(case_id="q1").prompt == "edited while a draft"
    # The way to change it: a copy, which is a draft.
    draft = copy_version(version)
    assert (draft.number, draft.locked, draft.source, draft.case_count) == (2, False, "copy", 3)
    edited = draft.cases.get(case_id="q1")
    edited.prompt = "edited in the copy"
    edited.save()


def test_export_round_trips_to_the_same_digest() -> None:
    suite = EvalSuite.objects.create(name="mine")
    version = import_jsonl(suite, GOOD)
    text = export_jsonl(version)
    assert len(text.splitlines()) == 3
    assert cases_digest(parse_jsonl(text)) == version.digest
    again = import_jsonl(suite, text)
    assert again.digest == version.digest


def test_shipped_suites_load_idempotently() -> None:
    created = seed_builtin_suites()
    names = sorted(v.suite.name for v in created)
    assert names == ["arithmetic", "basic-facts"]
    for version in created:
        assert version.suite.builtin and version.source == "builtin" and version.number == 1
        assert 30 <= version.case_count <= 60
        assert all(c.expected and c.match_rule for c in version.cases.all())
    assert seed_builtin_suites() == []
    assert EvalSuiteVersion.objects.count() == 2


def test_a_changed_shipped_file_adds_a_version(tmp_path: Path) -> None:
    source = BUILTIN_DIR / "arithmetic.jsonl"
    (tmp_path / "arithmetic.jsonl").write_bytes(source.read_bytes())
    assert len(seed_builtin_suites(tmp_path)) == 1
    with (tmp_path / "arithmetic.jsonl").open("a") as f:
        f.write(
            json.dumps({"id": "extra", "prompt": "1 + 1?", "expected": "2", "match_rule": "numeric"}) + "\n"
        )
    [v2] = seed_builtin_suites(tmp_path)
    assert v2.number == 2 and v2.case_count == 41


def test_the_shipped_answers_hold_for_a_perfect_answerer() -> None:
    """Each shipped expected answer is satisfiable: a plain sentence giving the answer matches it, and the
    same sentence with another answer does not."""
    for path in BUILTIN_DIR.glob("*.jsonl"):
        for case in parse_jsonl(path.read_bytes()):
            assert case.expected is not None
            if case.match_rule == "regex":
                # The shipped patterns are (?i)\b(first|second)\b: answer with the first alternative.
                answer = case.expected.split("(")[-1].split(")")[0].split("|")[0].title()
                right, wrong = f"It is {answer}.", "It is Atlantis."
            elif case.match_rule == "numeric":
                right, wrong = f"The answer is {case.expected}", "The answer is 123456789"
            else:
                right, wrong = f"{case.expected}) that one", "Z) another"
            assert answer_matches(right, case.expected, case.match_rule), case.case_id
            assert not answer_matches(wrong, case.expected, case.match_rule), case.case_id
