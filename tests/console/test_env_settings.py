"""The typed environment helpers reject what they cannot parse."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.env import EnvError, env_bool, env_int, env_limit, env_list, env_secret


def test_bool_accepts_only_true_or_false(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("X_FLAG", "true")
    assert env_bool("X_FLAG") is True
    monkeypatch.setenv("X_FLAG", "0")
    assert env_bool("X_FLAG", True) is False
    monkeypatch.setenv("X_FLAG", "maybe")
    with pytest.raises(EnvError, match="expected true or false"):
        env_bool("X_FLAG")


def test_int_and_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("X_N", "12")
    assert env_int("X_N", 1) == 12
    monkeypatch.setenv("X_N", "twelve")
    with pytest.raises(EnvError):
        env_int("X_N", 1)
    monkeypatch.setenv("X_L", "a, b,,c")
    assert env_list("X_L", []) == ["a", "b", "c"]


def test_limit_is_a_whole_number_or_none(monkeypatch: pytest.MonkeyPatch) -> None:
    assert env_limit("X_LIMIT", 60) == 60
    monkeypatch.setenv("X_LIMIT", "120")
    assert env_limit("X_LIMIT", 60) == 120
    monkeypatch.setenv("X_LIMIT", "None")
    assert env_limit("X_LIMIT", 60) is None
    for bad in ("-1", "1.5", "lots"):
        monkeypatch.setenv("X_LIMIT", bad)
        with pytest.raises(EnvError, match="'none'"):
            env_limit("X_LIMIT", 60)


def test_secret_reads_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    secret = tmp_path / "s"
    secret.write_text("from-file\n")
    monkeypatch.setenv("X_SECRET", "from-env")
    monkeypatch.setenv("X_SECRET_FILE", str(secret))
    assert env_secret("X_SECRET") == "from-file"
