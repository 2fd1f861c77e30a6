"""`inferchain bench` end to end against a real simulator: a sweep, and runs that must stop at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.cli import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_STOPPED, main
from vllm_sim.testing import SimHandle, free_port, running_sim

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-bench-test-0123456789"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with running_sim("bench-model", "--sim-time-scale", "0.2", api_key=KEY) as handle:
        yield handle


@pytest.fixture
def key_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERCHAIN_API_KEY", KEY)


def bench(*args: str) -> int:
    return main(["bench", "--no-progress", *args])


def test_a_sweep_reports_every_level_with_token_timing(sim: SimHandle, key_env: None, tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    code = bench(
        "--target", sim.base_url, "--clients", "1,4", "--requests", "8", "--prompt-tokens", "40",
        "--output-tokens", "12", "--no-stop-at-knee", "--out", str(out),
    )  # fmt: skip
    assert code == 0
    result = json.loads(out.read_text())
    assert result["model"] == "bench-model"
    assert [lv["clients"] for lv in result["levels"]] == [1, 4]
    for lv in result["levels"]:
        assert lv["ok"] == 8 and lv["errors"] == {}
        assert 0 < lv["ttft_s"]["p50"] < lv["latency_s"]["p50"]
        assert lv["itl_s"]["p50"] > 0
        assert lv["output_tokens_per_s"] > 0
    assert out.with_suffix(".png").stat().st_size > 1000
    assert out.with_suffix(".svg").read_text().lstrip().startswith("<?xml")


def test_a_wrong_key_stops_at_once(
    sim: SimHandle, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("INFERCHAIN_API_KEY", "sk-wrong")
    t0 = time.monotonic()
    code = bench("--target", sim.base_url, "--out", str(tmp_path / "r.json"))
    assert code == EXIT_STOPPED
    assert time.monotonic() - t0 < 10
    err = capsys.readouterr().err
    assert "refused the API key (HTTP 401)" in err
    assert "sk-wrong" not in err
    assert not (tmp_path / "r.json").exists()


def test_an_unreachable_target_stops_at_once(key_env: None, capsys: pytest.CaptureFixture[str]) -> None:
    code = bench("--target", f"http://127.0.0.1:{free_port()}")
    assert code == EXIT_STOPPED
    assert "cannot reach http://127.0.0.1:" in capsys.readouterr().err


def test_an_unknown_model_is_named(sim: SimHandle, key_env: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench("--target", sim.base_url, "--model", "nope") == EXIT_STOPPED
    assert "does not serve 'nope'; it serves: bench-model" in capsys.readouterr().err


def test_a_bad_workload_line_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    w = tmp_path / "w.jsonl"
    w.write_text('{"prompt": "a"}\n{"prompt": "b", "max_tokens": -1}\n')
    assert bench("--target", "http://127.0.0.1:1", "--workload", str(w)) == EXIT_BAD_INPUT
    assert f"{w} line 2: 'max_tokens' must be a positive integer" in capsys.readouterr().err


def test_ctrl_c_writes_what_was_measured(sim: SimHandle, tmp_path: Path) -> None:
    out = tmp_path / "partial.json"
    cmd = [
        sys.executable, "-m", "bench", "--no-progress", "--no-plot", "--target", sim.base_url,
        "--clients", "2", "--requests", "400", "--output-tokens", "64", "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "INFERCHAIN_API_KEY": KEY, "PYTHONPATH": str(ROOT)}
    # Ctrl-C as a terminal delivers it: a suite started in the background by a non-interactive shell
    # (`make test &`) runs with SIGINT ignored, every child inherits that, and Python then installs no
    # KeyboardInterrupt handler: the bench ran on through the signal and this test timed out.
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    time.sleep(4.0)
    proc.send_signal(signal.SIGINT)
    _stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == EXIT_INTERRUPTED, stderr
    result = json.loads(out.read_text())
    assert result["interrupted"] is True
    (level,) = result["levels"]
    assert level["partial"] is True
    assert 0 < level["ok"] < 400
    assert "interrupted; writing what was measured so far" in stderr
