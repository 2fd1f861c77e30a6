"""While the database is down, request-log rows are spooled to disk and written once it is back."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from routing.proxy.requestlog import RequestLogWriter


class FlakyDatabase:
    def __init__(self) -> None:
        self.up = False
        self.rows: list[dict[str, Any]] = []

    def __call__(self, rows: list[dict[str, Any]]) -> None:
        if not self.up:
            raise ConnectionError("database is down")
        self.rows.extend(rows)


async def test_rows_survive_an_outage(tmp_path: Path) -> None:
    db = FlakyDatabase()
    writer = RequestLogWriter(tmp_path, writer=db)
    for i in range(3):
        writer.add({"request_id": f"a{i}", "status": 200})
    await writer.flush()
    assert db.rows == []
    assert len(list(tmp_path.glob("*.jsonl"))) == 1
    writer.add({"request_id": "b0", "status": 500})
    await writer.flush()
    db.up = True
    writer.add({"request_id": "c0", "status": 200})
    await writer.flush()
    assert sorted(r["request_id"] for r in db.rows) == ["a0", "a1", "a2", "b0", "c0"]
    assert list(tmp_path.glob("*")) == []
    await writer.close()


def test_real_database_write(tmp_path: Path, transactional_db: None) -> None:
    from routing.models import RequestLog

    async def run() -> None:
        writer = RequestLogWriter(tmp_path)
        writer.add({"request_id": "x", "status": 200, "alias": "m", "tenant_name": "t"})
        await writer.close()

    asyncio.run(run())
    assert RequestLog.objects.filter(request_id="x", alias="m").count() == 1


def test_copy_keeps_awkward_text_and_survives_nul(tmp_path: Path, transactional_db: None) -> None:
    """PostgreSQL gets the batch by COPY: tabs, newlines, backslashes and quotes arrive as sent, NULL stays
    NULL, and a NUL in a client's model name or prompt (which PostgreSQL text cannot hold) is replaced,
    so the batch is written rather than spooled."""
    from routing.models import RequestLog

    awkward = 'tab\there\nnew "line" \\N back\\slash ünï'

    async def run() -> None:
        writer = RequestLogWriter(tmp_path)
        writer.add(
            {
                "request_id": "awkward",
                "status": 200,
                "alias": "m",
                "prompt_text": awkward,
                "response_text": None,
                "stream": True,
                "prompt_tokens": 7,
            }
        )
        writer.add({"request_id": "nul", "status": 404, "alias": "bad\x00model", "prompt_text": "a\x00b"})
        await writer.close()

    asyncio.run(run())
    row = RequestLog.objects.get(request_id="awkward")
    assert (row.prompt_text, row.response_text, row.stream, row.prompt_tokens) == (awkward, None, True, 7)
    nul = RequestLog.objects.get(request_id="nul")
    assert (nul.alias, nul.prompt_text) == ("bad\ufffdmodel", "a\ufffdb")
    assert not list(tmp_path.glob("*.jsonl"))  # nothing was spooled
