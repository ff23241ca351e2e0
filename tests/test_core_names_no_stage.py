"""The core names no stage (issue 36.3): what it knows of a stage comes through the StageSpec, so adding
or changing one never edits the core (docs/adding-a-stage.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import REPO

from launcher.registry import STAGES

CORE = (
    "cli",
    "validate",
    "pipeline",
    "summary",
    "data_owner",
    "preflight",
    "context",
    "relaunch",
    "registry",
)
# What every stage's jobs share (make_job, mounts): a helper of all stages, not one stage's.
SHARED = frozenset({"common"})


def _stage_modules() -> frozenset[str]:
    found = {path.stem for path in (REPO / "launcher/stages").glob("*.py")} - {"__init__"} - SHARED
    return frozenset(f"launcher.stages.{name}" for name in found)


def _imported(node: ast.AST) -> list[str]:
    """The modules an import statement names (`from launcher.stages import x` names launcher.stages.x)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.module:
        return [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    return []


def stage_names_in(source: str, names: frozenset[str], modules: frozenset[str]) -> list[str]:
    """Where `source` names a stage: a string literal equal to a stage's name, or an import of a stage's
    module; each as `line N: ...`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
            found.append(f"line {node.lineno}: {node.value!r}")
        found += [f"line {node.lineno}: import {name}" for name in _imported(node) if name in modules]
    return found


def test_the_check_finds_a_literal_and_an_import() -> None:
    """The test below can fail: a stage's name as a literal, or its module imported, is found."""
    source = (
        "from launcher.stages import training_record\nimport launcher.stages.samples\n"
        "if job.stage == 'training':\n    pass\nprint(f'{x} training')\n"
    )
    assert stage_names_in(source, frozenset({"training"}), _stage_modules()) == [
        "line 1: import launcher.stages.training_record",
        "line 2: import launcher.stages.samples",
        "line 3: 'training'",
    ]


@pytest.mark.parametrize("module", CORE)
def test_the_core_module_names_no_stage(module: str) -> None:
    names = frozenset(stage.name for stage in STAGES)
    source = Path(REPO / f"launcher/{module}.py").read_text()
    assert stage_names_in(source, names, _stage_modules()) == []
