"""The layers hold: the import contracts pass on the tree, catch a wrong import, and the docs draw them.

`lint-imports` reads the contracts in pyproject.toml. The broken-copy tests prove the contracts bite:
a copy of the product packages with one forbidden import added must fail the same command.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

from tools import architecture

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = (
    "inferchain",
    "alerts",
    "routing",
    "nodes",
    "models_registry",
    "console",
    "core",
    "bench",
    "vllm_sim",
)
LINT_IMPORTS = str(Path(sys.executable).parent / "lint-imports")


def lint_imports(root: Path, *contracts: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    only = [arg for contract in contracts for arg in ("--contract", contract)]
    return subprocess.run(
        [LINT_IMPORTS, "--no-cache", *only], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_tree_keeps_every_contract() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 5 kept, 0 broken." in result.stdout


@pytest.fixture
def tree_copy(tmp_path: Path) -> Path:
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__", "migrations")
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


@pytest.mark.parametrize(
    ("module", "wrong_import", "contract"),
    [
        ("models_registry/wrong.py", "from routing.models import RoutePool\n", "layers"),
        ("core/wrong.py", "from console.models import Tenant\n", "layers"),
        ("console/wrong.py", "import models_registry.models\n", "layers"),
        ("vllm_sim/wrong.py", "from django.conf import settings\n", "simulator-stands-alone"),
        ("vllm_sim/wrong2.py", "from core.redis_client import get_redis\n", "simulator-stands-alone"),
        ("vllm_sim/wrong3.py", "from nodes.engines.vllm import KV_CACHE_DTYPES\n", "simulator-stands-alone"),
        ("bench/wrong.py", "from vllm_sim.testing import start_sim\n", "bench-stands-alone"),
        ("nodes/agent/remote.py", "from nodes.models import Deployment\n", "fleet-agent-without-database"),
        (
            "nodes/engines/llamacpp_server.py",
            "from django.conf import settings\n",
            "llamacpp-engine-stands-alone",
        ),
    ],
)
def test_a_wrong_import_breaks_a_contract(
    tree_copy: Path, module: str, wrong_import: str, contract: str
) -> None:
    (tree_copy / module).write_text(wrong_import)
    assert lint_imports(tree_copy).returncode == 1
    result = lint_imports(tree_copy, contract)
    assert result.returncode == 1, result.stdout
    assert "1 broken" in result.stdout
    assert module.removesuffix(".py").replace("/", ".") in result.stdout


def test_no_import_cycle_between_any_two_product_modules() -> None:
    graph = grimp.build_graph(*PACKAGES)
    cycles = []
    for module in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if imported in graph.modules and graph.chain_exists(importer=imported, imported=module):
                cycles.append(f"{module} -> {imported} -> ... -> {module}")
    assert cycles == []


def test_the_docs_draw_the_contracts() -> None:
    assert architecture.documented() == architecture.diagram(), (
        "docs/architecture.md is stale: run `python -m tools.architecture`"
    )
