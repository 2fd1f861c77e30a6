"""Engine logs: a fresh file per launch (older ones kept and numbered), copy-truncate when too large."""

from __future__ import annotations

from pathlib import Path

from nodes.process import rotate_log, tail, truncate_if_large


def test_rotation_keeps_the_last_launches(tmp_path: Path) -> None:
    log = tmp_path / "deployment-1.log"
    for launch in range(4):
        rotate_log(log, keep=2)
        log.write_text(f"launch {launch}\n")
    assert log.read_text() == "launch 3\n"
    assert (tmp_path / "deployment-1.log.1").read_text() == "launch 2\n"
    assert (tmp_path / "deployment-1.log.2").read_text() == "launch 1\n"
    assert not (tmp_path / "deployment-1.log.3").exists()


def test_large_log_is_copied_and_truncated_in_place(tmp_path: Path) -> None:
    log = tmp_path / "deployment-2.log"
    with log.open("ab") as writer:  # like the engine: append mode, file kept open
        writer.write(b"x" * 2000)
        writer.flush()
        assert truncate_if_large(log, max_bytes=1000, keep=3)
        writer.write(b"after\n")
        writer.flush()
    assert (tmp_path / "deployment-2.log.1").stat().st_size == 2000
    assert log.read_bytes() == b"after\n"
    assert not truncate_if_large(log, max_bytes=1000, keep=3)


def test_tail_reads_only_the_end(tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    log.write_text("".join(f"{i}\n" for i in range(100_000)))
    assert tail(log, 2).splitlines() == ["99998", "99999"]
    assert tail(tmp_path / "missing.log") == ""
