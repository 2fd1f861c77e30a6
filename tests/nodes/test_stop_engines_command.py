"""`manage.py stop_engines` (make stop) ends recorded engines and nothing else."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import asdict
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from nodes import process

pytestmark = pytest.mark.django_db


def test_stops_recorded_engines_but_not_a_pid_without_the_token(node_settings: Any, tmp_path: Path) -> None:
    directory = Path(node_settings.ENGINE_LOG_DIR) / "demo-host"
    record = process.start_engine(
        argv=[sys.executable, "-c", "import time; time.sleep(60)"],
        env={},
        directory=directory,
        deployment_id=41,
        port=1,
        start_token="tok-41",
        log_keep=1,
    )
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    # A stale record whose pid now belongs to a process that is not the engine.
    stale = process.EngineRecord(42, stranger.pid, 2, "tok-42", str(directory / "x.log"), time.time())
    process.state_file(directory, 42).write_text(json.dumps(asdict(stale)))
    try:
        out = StringIO()
        call_command("stop_engines", "--timeout", "5", stdout=out)
        assert "stopped 1 engine(s): deployments [41]" in out.getvalue()
        assert not process.is_alive(record.pid)
        assert stranger.poll() is None
        assert process.read_record(directory, 41) is None and process.read_record(directory, 42) is None
    finally:
        stranger.kill()
        stranger.wait()
