"""The shipped Prometheus alert rules parse (`promtool check rules`) and behave as their unit tests say
(`promtool test rules`): an engine that goes down fires after 2 minutes and resolves when it recovers,
and each other alert fires on its condition (deploy/prometheus/inferchain-rules.test.yml).

promtool comes from Debian's `prometheus` package; `make test` installs it (the Makefile's `promtool`).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

RULES_DIR = Path(__file__).resolve().parents[1] / "deploy" / "prometheus"


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is missing: `make promtool` (or apt-get install prometheus) installs it")
    return path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args], cwd=RULES_DIR, capture_output=True, text=True, timeout=120, check=False
    )


def test_rules_file_is_valid() -> None:
    result = run("check", "rules", "inferchain-rules.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 10 rules found" in result.stdout


def test_rules_unit_tests_pass() -> None:
    result = run("test", "rules", "inferchain-rules.test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_broken_expectation_fails(tmp_path: Path) -> None:
    """The unit tests can fail: an engine down for only one minute must not be expected to fire."""
    broken = (
        (RULES_DIR / "inferchain-rules.test.yml").read_text().replace("eval_time: 5m", "eval_time: 3m", 1)
    )
    broken = broken.replace("exp_alerts: []  # pending", "exp_alerts: []  # was pending", 1)
    (tmp_path / "inferchain-rules.yml").write_text((RULES_DIR / "inferchain-rules.yml").read_text())
    (tmp_path / "t.yml").write_text(broken)
    result = subprocess.run(
        [promtool(), "test", "rules", "t.yml"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0 and "InferchainEngineDown" in result.stdout + result.stderr
