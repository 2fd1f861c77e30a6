"""A launch re-checks the files on its host, so a file swapped after a passing run is never served."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nodes.agent.runtime import verify_files


def test_file_changed_after_a_passing_run_blocks_launch(make_deployment: Any) -> None:
    deployment = make_deployment()
    assert verify_files(deployment) is None  # registered and verified on this host: fine

    config = Path(deployment.model_version.source_path) / "config.json"
    config.write_text(config.read_text().replace("}", ', "swapped": true}', 1))

    problem = verify_files(deployment)
    assert problem is not None
    assert "config.json" in problem and deployment.host.name in problem
