"""The import contracts (pyproject.toml's [tool.importlinter], run as `lint-imports`) hold what they claim:
each import issue 47 found passing is refused on a scratch copy of the tree, every module sits in a layer,
and every launcher module is either shared with the job programs or forbidden to them."""

from __future__ import annotations

import ast
import itertools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: import-linter depends on tomli there
    import tomli as tomllib  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("launcher", "data_prep")
CONTRACTS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
JOBS = "Job programs and what they share with the planner never import the planner"
STAGES = "Stages never import one another: what two share lives below them"
TRAINING_PARTS = "Training's own parts are its own: no other stage imports them"
FAMILIES = (
    "Model families never import one another (what they share is a parts module: launcher.families.ldm)"
)
DATA_STEPS = "A data step is started (python -m data_prep.<step>), never imported but by data_prep"
LAUNCHER_OVER_DATA_PREP = (
    "The launcher over data_prep: data_prep (the data programs and what every job shares) imports nothing of "
    "the launcher"
)
LAUNCHER_LAYERS = "The launcher's layers: a module imports only from the layers below it"
NEW_FAMILY = "launcher/families/toy.py"
PLUGIN_INDEPENDENCE = "Plugins never import one another (each is one package: launcher/plugins/<name>/)"
PLUGIN_OFF_PLANNER = "A plugin's family and job programs run in the jobs: they never import the planner"
PLUGIN_PROGRAMS = (
    "A plugin's job program is started (python -m launcher.plugins.<name>.<program>), never imported"
)
FAMILIES_ARE_DATA = "Model families are data for the planner and the jobs: they import neither"
# Each import that passed `lint-imports` before (issue 47), as (file, line added to it), and the contract
# that refuses it. A new built-in family is declared in the families' independent layer (pyproject.toml).
REFUSED = {
    "a job program imports launcher.sizing": ("launcher/jobs/score.py", "from launcher import sizing", JOBS),
    "a job program imports launcher.latents": (
        "launcher/jobs/samples.py",
        "from launcher import latents",
        JOBS,
    ),
    "a job program imports launcher.layout": ("launcher/jobs/rehearsal.py", "import launcher.layout", JOBS),
    "a job program imports launcher.job_states": (
        "launcher/jobs/bench_report.py",
        "from launcher import job_states",
        JOBS,
    ),
    "stages/samples imports stages.training_status": (
        "launcher/stages/samples.py",
        "from launcher.stages import training_status",
        TRAINING_PARTS,
    ),
    "stages/evaluation imports stages.training_init": (
        "launcher/stages/evaluation.py",
        "from launcher.stages import training_init",
        TRAINING_PARTS,
    ),
    "stages/samples imports stages.training": (
        "launcher/stages/samples.py",
        "from launcher.stages import training",
        STAGES,
    ),
    "a new family imports families.sd2": (NEW_FAMILY, "from launcher.families import sd2", FAMILIES),
    "a plugin imports SDXL's plugin": (
        "launcher/plugins/controlnet/infer.py",
        "from launcher.plugins.sdxl import family",
        PLUGIN_INDEPENDENCE,
    ),
    "families/ldm.py imports data_prep.download_images": (
        "launcher/families/ldm.py",
        "from data_prep import download_images",
        DATA_STEPS,
    ),
    # launcher.sampling.sampled is launcher.stages.sampled now: data_prep imports neither.
    "data_prep/tar_checks imports launcher.stages.sampled": (
        "data_prep/tar_checks.py",
        "from launcher.stages import sampled",
        LAUNCHER_OVER_DATA_PREP,
    ),
    "data_prep/tar_checks imports launcher.sampling": (
        "data_prep/tar_checks.py",
        "from launcher.sampling import settings",
        LAUNCHER_OVER_DATA_PREP,
    ),
    "a module in no layer": ("launcher/newcomer.py", "VALUE = 1", LAUNCHER_LAYERS),
    "a plugin's family imports the planner": (
        "launcher/plugins/controlnet/family.py",
        "from launcher import cli",
        PLUGIN_OFF_PLANNER,
    ),
    "a plugin's stage imports its job program": (
        "launcher/plugins/controlnet/stage.py",
        "from launcher.plugins.controlnet import hints",
        PLUGIN_PROGRAMS,
    ),
    "a plugin imports another": (
        "launcher/plugins/dreambooth/stage.py",
        "from launcher.plugins.controlnet import family as controlnet_family",
        PLUGIN_INDEPENDENCE,
    ),
}


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` on the tree at `root` (its packages first on sys.path), as tests/run.sh runs it."""
    runner = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run(
        [sys.executable, "-c", runner, "--no-cache", "--no-logo"],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root), "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def broken(result: subprocess.CompletedProcess[str]) -> list[str]:
    """The names of the broken contracts, from the report's "Broken contracts" section."""
    section = result.stdout.partition("Broken contracts\n")[2].splitlines()
    return [name for name, rule in itertools.pairwise(section) if rule and set(rule) == {"-"} and name]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What lint-imports reads of the tree (the packages, pyproject.toml), copied."""
    root = tmp_path_factory.mktemp("tree")
    for package in PACKAGES:
        shutil.copytree(REPO / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", root)
    return root


def test_the_tree_as_it_is_keeps_every_contract(scratch: Path) -> None:
    result = lint(scratch)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"Contracts: {len(CONTRACTS)} kept, 0 broken." in result.stdout


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_the_contracts_refuse_the_import(case: str, scratch: Path) -> None:
    file, line, contract = REFUSED[case]
    path, pyproject = scratch / file, scratch / "pyproject.toml"
    before, config = (path.read_text() if path.exists() else None), pyproject.read_text()
    try:
        path.write_text(f"{before or ''}\n{line}\n")
        if file == NEW_FAMILY:
            pyproject.write_text(config.replace('"sd1 | sd2"', '"sd1 | sd2 | toy"'))
        result = lint(scratch)
    finally:
        if before is None:
            path.unlink()
        else:
            path.write_text(before)
        pyproject.write_text(config)
    assert result.returncode != 0, result.stdout[-3000:]
    assert contract in broken(result), result.stdout[-3000:]


def _contracts(kind: str) -> list[dict]:
    return [c for c in CONTRACTS if c["type"] == kind]


def _children(package: Path) -> set[str]:
    """The modules and packages directly in `package`, by name."""
    return {
        p.stem if p.suffix == ".py" else p.name
        for p in package.iterdir()
        if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()
    }


def test_every_package_of_two_modules_or_more_has_an_exhaustive_layers_contract() -> None:
    """So every module sits in a layer: lint-imports fails on a child of the container no layer names."""
    exhaustive = {
        c for contract in _contracts("layers") if contract.get("exhaustive") for c in contract["containers"]
    }
    packages = {
        ".".join(init.parent.relative_to(REPO).parts)
        for package in PACKAGES
        for init in (REPO / package).rglob("__init__.py")
        if len(_children(init.parent)) >= 2
    }
    assert packages - exhaustive == set()
    assert {"launcher", "data_prep", "launcher.stages", "launcher.families", "launcher.jobs"} <= exhaustive


def test_every_launcher_module_is_shared_with_the_jobs_or_forbidden_to_them() -> None:
    """A new planner module is forbidden to the job programs from the start, or declared shared. The
    in-tree plugins hold both (a plugin's family and job programs, and its stage): their own contract in
    pyproject.toml keeps a plugin's family and programs off the planner."""
    (contract,) = [c for c in _contracts("forbidden") if c["name"] == JOBS]
    shared, forbidden = set(contract["source_modules"]), set(contract["forbidden_modules"])
    assert shared & forbidden == set()
    children = {f"launcher.{name}" for name in _children(REPO / "launcher")}
    assert children - {"launcher.plugins"} == shared | forbidden


def _started(path: Path) -> bool:
    """The module runs as a program: it has an `if __name__ == "__main__":` block."""
    return any(
        isinstance(node, ast.If)
        and "__name__" in ast.unparse(node.test)
        and "__main__" in ast.unparse(node.test)
        for node in ast.parse(path.read_text()).body
    )


def test_every_program_is_protected() -> None:
    """What a job starts (`python -m ...`) is imported only by programs of its own package."""
    protected = {m for c in _contracts("protected") for m in c["protected_modules"]}
    data_steps = {f"data_prep.{p.stem}" for p in (REPO / "data_prep").glob("*.py") if _started(p)}
    assert "launcher.jobs" in protected  # every module in it
    assert data_steps == {m for m in protected if m.startswith("data_prep.")}
    assert {"data_prep.data_check", "data_prep.encode_latents"} <= data_steps


def _in_tree_plugins() -> list[str]:
    return sorted(p.parent.name for p in (REPO / "launcher" / "plugins").glob("*/__init__.py"))


def test_each_in_tree_plugin_sits_in_its_contracts() -> None:
    """A plugin is one package apart from the others, its family is data like the built-in ones, and its
    family and job programs (modules started with python -m) are kept off the planner as the jobs' are."""
    # One layer of siblings ("a | b"): independent of one another, and exhaustive, so a new plugin must join it.
    (independence,) = [c for c in _contracts("layers") if c["name"] == PLUGIN_INDEPENDENCE]
    (siblings,) = independence["layers"]
    (off_planner,) = [c for c in _contracts("forbidden") if c["name"] == PLUGIN_OFF_PLANNER]
    (jobs,) = [c for c in _contracts("forbidden") if c["name"] == JOBS]
    (data,) = [c for c in _contracts("forbidden") if c["name"] == FAMILIES_ARE_DATA]
    (programs,) = [c for c in _contracts("protected") if c["name"] == PLUGIN_PROGRAMS]
    assert off_planner["forbidden_modules"] == jobs["forbidden_modules"]
    exhaustive = {
        c for contract in _contracts("layers") if contract.get("exhaustive") for c in contract["containers"]
    }
    assert _in_tree_plugins(), "no in-tree plugin found"
    for name in _in_tree_plugins():
        package = REPO / "launcher" / "plugins" / name
        module = f"launcher.plugins.{name}"
        started = {f"{module}.{p.stem}" for p in package.glob("*.py") if _started(p)}
        assert name in {sibling.strip() for sibling in siblings.split("|")}
        assert module in exhaustive
        assert f"{module}.family" in data["source_modules"]
        assert {f"{module}.family", *started} <= set(off_planner["source_modules"])
        assert started <= set(programs["protected_modules"])
