"""The imports' shape. The contracts (layers, job programs off the planner, stages independent, no cycle
between siblings) are in pyproject.toml's [tool.importlinter] and run as `lint-imports` (tests/run.sh);
here, what they do not say: no cycle between two modules at all (a package and its own child, say), and
one way for the jobs to find the checkout."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# `python launcher/main.py` works in a checkout that is not installed: the one module started by path.
BOOTSTRAP = (
    'if __package__ in (None, ""):  # started by path: the checkout replaces this file\'s folder on sys.path\n'
    '    sys.path[0] = str(next(p for p in Path(__file__).resolve().parents if not (p / "__init__.py").exists()))\n'
)
EDITS_SYS_PATH = re.compile(r"sys\.path(\.insert|\.append|\.extend|\[[^\]]*\]\s*=)")


def test_no_module_imports_itself_through_others() -> None:
    grimp = pytest.importorskip("grimp")  # import-linter's graph: imports inside functions count too
    graph = grimp.build_graph("launcher", "data_prep", cache_dir=None)
    assert Path(importlib.import_module("launcher").__file__).parent == REPO / "launcher"  # this checkout's
    cycles = {
        " -> ".join((importer, *back))
        for importer in sorted(graph.modules)
        for imported in graph.find_modules_directly_imported_by(importer)
        if (back := graph.find_shortest_chain(imported, importer))
    }
    assert not cycles, f"move what each cycle's modules share into a lower module: {sorted(cycles)}"


def test_jobs_start_modules_in_the_checkout_and_only_main_finds_it_by_path() -> None:
    """Every job starts this repo's programs as `python -m <module>` in the checkout (its working folder:
    the container's --container-workdir, or the script's `cd`), so no job program edits sys.path."""
    modules = [
        p.relative_to(REPO) for folder in ("launcher", "data_prep") for p in (REPO / folder).rglob("*.py")
    ]
    golden = "".join(script.read_text() for script in (REPO / "tests/golden").rglob("*.sbatch"))
    assert [str(m) for m in modules if re.search(rf"/{re.escape(str(m))}(?![\w.])", golden)] == []
    started = set(re.findall(r" -m ((?:launcher|data_prep)\.[\w.]+)", golden))
    assert {"launcher.jobs.samples", "launcher.jobs.rehearsal", "data_prep.data_check"} <= started
    assert [m for m in sorted(started) if importlib.util.find_spec(m) is None] == []
    editing = {str(m) for m in modules if EDITS_SYS_PATH.search((REPO / m).read_text())}
    # And launcher.discovery, which puts a run folder's copy of its plugins first (SD_LAUNCHER_PLUGINS).
    assert editing == {"launcher/main.py", "launcher/discovery.py"}
    assert (REPO / "launcher/main.py").read_text().count(BOOTSTRAP) == 1


@pytest.mark.parametrize(
    ("workdir", "refused"), [(None, False), ("/workspace/launcher", False), ("/workspace", True)]
)
def test_the_container_starts_the_jobs_in_the_checkout(workdir: str | None, refused: bool) -> None:
    """The job's working folder is the one place that puts the checkout on the jobs' sys.path."""
    from conftest import FIXED_FACTS, compose_config

    from launcher.errors import ConfigError
    from launcher.validate import check_facts, to_schema

    overrides = ["cluster=aws_p5", "container.code_dir=/workspace/launcher", "stages=[data_preparation]"]
    cfg = to_schema(compose_config([*overrides, f"container.workdir={workdir or 'null'}"]))
    if not refused:
        check_facts(cfg, FIXED_FACTS)
        return
    with pytest.raises(
        ConfigError, match=r"^container.workdir: /workspace: .*allowed: null or .*/workspace/launcher"
    ):
        check_facts(cfg, FIXED_FACTS)
