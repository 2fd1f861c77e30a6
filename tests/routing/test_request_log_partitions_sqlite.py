"""On SQLite (the zero-setup demo) the request log stays a plain table and retention deletes rows."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

SEED = """
import datetime as dt
from django.utils import timezone
from routing.models import RequestLog
now = timezone.now()
RequestLog.objects.bulk_create(
    [RequestLog(created_at=now - dt.timedelta(days=d), status=200) for d in (0, 2, 9, 40)]
)
"""
AGES = """
from django.utils import timezone
from routing.models import RequestLog
print(sorted((timezone.now() - r.created_at).days for r in RequestLog.objects.all()))
"""


def manage(tmp_path: Path, *args: str) -> str:
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'demo.sqlite3'}",
        "REQUEST_LOG_RETENTION_DAYS": "7",
    }
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_sqlite_migrates_and_prunes_rows(tmp_path: Path) -> None:
    manage(tmp_path, "migrate", "--verbosity", "0")
    manage(tmp_path, "shell", "-c", SEED)
    out = manage(tmp_path, "request_log_partitions")
    assert "not partitioned; deleted 2 rows past retention" in out
    assert manage(tmp_path, "shell", "-c", AGES).splitlines()[-1] == "[0, 2]"
    assert "not partitioned" in manage(tmp_path, "request_log_partitions", "--show")
