"""The stage contract: a stage added as one module (here, one test file) is validated, planned, linked
by need and run, with no change anywhere else (docs/adding-a-stage.md)."""

from __future__ import annotations

import ast
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXED_FACTS, REPO, compose_config

from launcher.backends import get, prepare
from launcher.context import Context, Facts
from launcher.errors import ConfigError
from launcher.pipeline import build_plan
from launcher.registry import STAGES, planned_names
from launcher.rules import Range, Text, ruled
from launcher.spec import Dependency, JobSpec, Resources
from launcher.stage import StageSpec
from launcher.stages.common import make_job
from launcher.validate import check_facts, to_schema


@dataclass
class GreetingConfig:
    greeting: str = ruled(Text(), "hello", help="What the job prints.")
    times: int = ruled(Range(1, 3), 1, help="How many times it prints it.")


def _plan(ctx: Context) -> tuple[JobSpec, ...]:
    g = ctx.cfg.greeting
    out = ctx.run_dir / "greeting" / "out.txt"
    argv = (
        "bash",
        "-c",
        'for _ in $(seq "$1"); do echo "$2"; done > "$3"',
        "greet",
        g.times,
        g.greeting,
        out,
    )
    return (make_job(ctx, stage="greeting", name="greet", argv=tuple(map(str, argv)), resources=Resources()),)


def _check(cfg: Any, planned: frozenset[str]) -> None:
    if "bye" in cfg.greeting.greeting:
        raise ConfigError("greeting.greeting", "is a farewell; allowed: a greeting")


GREETING = StageSpec(
    name="greeting",
    config=GreetingConfig,
    plan=_plan,
    needs=lambda cfg: ("data_preparation",),
    check=_check,
    notes=lambda ctx: (f"greeting: {ctx.cfg.greeting.times} time(s)",),
)
WITH_GREETING = (*STAGES, GREETING)


def _cfg(tmp_path: Path, *overrides: str) -> Any:
    composed = compose_config([f"cluster.shared_dir={tmp_path}", *overrides])
    return to_schema(composed, WITH_GREETING)


def test_a_new_stage_is_planned_after_what_it_needs_with_its_section_and_notes(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "stages=[greeting,data_preparation]", "+greeting.greeting=good day")
    plan = build_plan(cfg, FIXED_FACTS, WITH_GREETING)
    assert [job.name for job in plan.jobs][-2:] == ["generate_wdinfo", "greet"]
    assert [d.job for d in plan.job("greet").depends_on] == ["generate_wdinfo"]
    assert "greeting: 1 time(s)" in plan.notes
    assert "'good day'" in dict(prepare(plan).scripts)[plan.job("greet")]


def test_a_new_stage_alone_waits_for_nothing_and_is_not_known_without_its_module(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "stages=[greeting]")
    assert planned_names(cfg, WITH_GREETING) == {"greeting"}
    assert build_plan(cfg, FIXED_FACTS, WITH_GREETING).job("greet").depends_on == ()
    with pytest.raises(
        ConfigError, match=r"'greeting' is not a choice; allowed: one of 'assets', .*'training'"
    ):
        to_schema(compose_config([f"cluster.shared_dir={tmp_path}", "stages=[greeting]"]))


@pytest.mark.parametrize(
    ("override", "key", "allowed"),
    [
        ("+greeting.times=7", "greeting.times", "an integer from 1 to 3"),
        ("+greeting.greeting=goodbye", "greeting.greeting", "a farewell; allowed: a greeting"),
        ("+greeting.colour=red", "greeting.colour", "allowed keys in greeting: greeting, times"),
    ],
)
def test_a_new_stage_s_rules_and_checks_run_in_the_one_validation_phase(
    tmp_path: Path, override: str, key: str, allowed: str
) -> None:
    with pytest.raises(ConfigError, match=allowed) as error:
        _cfg(tmp_path, "stages=[greeting]", override)
    assert error.value.key == key


def test_a_stage_that_is_not_planned_is_not_checked(tmp_path: Path) -> None:
    """Its section is not used, so its checks are not called (its fields' own rules still apply)."""
    _cfg(tmp_path, "stages=[data_preparation]", "+greeting.greeting=goodbye")
    with pytest.raises(ConfigError, match="an integer from 1 to 3"):
        _cfg(tmp_path, "stages=[data_preparation]", "+greeting.times=7")


def test_a_new_stage_runs_on_the_local_backend(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "stages=[greeting]", "+greeting.times=2", "+greeting.greeting=hi there")
    facts = Facts(python=sys.executable, code_dir=str(REPO))
    check_facts(cfg, facts, WITH_GREETING)
    plan = build_plan(cfg, facts, WITH_GREETING)
    ids = get("local", parallelism=1).schedule(prepare(plan))
    assert (plan.run_dir / "greeting" / "out.txt").read_text() == "hi there\nhi there\n"
    jobs = json.loads((plan.run_dir / "manifest.json").read_text())["jobs"]
    assert [(job["name"], job["job_id"]) for job in jobs] == [("greet", ids["greet"])]


def _launcher_imports(path: Path) -> set[str]:
    """The launcher modules a file imports (`from launcher import x` counts as launcher.x)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in found if name.startswith("launcher")}


def test_what_the_stages_import_imports_no_stage() -> None:
    """Layers: the modules the stages build on (context, spec, stage, nemo_config, latents...) never
    reach back up into launcher.stages; the typed Dependency(stage=...) links stages instead."""
    stage_files = sorted((REPO / "launcher/stages").glob("*.py"))
    below = {
        name
        for path in stage_files
        for name in _launcher_imports(path)
        if not name.startswith("launcher.stages") and (REPO / f"{name.replace('.', '/')}.py").exists()
    }
    assert {"launcher.context", "launcher.stage", "launcher.nemo_config", "launcher.latents"} <= below
    upward = {
        (name, imported)
        for name in below
        for imported in _launcher_imports(REPO / f"{name.replace('.', '/')}.py")
        if imported.startswith("launcher.stages")
    }
    assert upward == set()


def test_an_edge_to_a_stage_becomes_edges_to_its_last_jobs_or_none(make_config: Any) -> None:
    """Dependency(stage="assets") (the encode step's `uses`): its last jobs when planned, else nothing."""
    facts = Facts(python="/usr/bin/python3", code_dir="/opt/launcher", nemo_python="/opt/nemo/bin/python")
    for assets, waits in ((True, ["generate_wdinfo", "pretrained_assets"]), (False, ["generate_wdinfo"])):
        cfg = make_config("data_preparation.precache.enable=true", f"assets.enable={str(assets).lower()}")
        encode = build_plan(cfg, facts).job("encode_latents")
        assert sorted(dep.job for dep in encode.depends_on) == waits
        assert all(dep.stage is None for dep in encode.depends_on)
    with pytest.raises(ValueError, match="a job or a stage"):
        Dependency("a", stage="assets")


def test_a_stage_s_probe_runs_once_when_planned_and_its_planner_reads_the_result(tmp_path: Path) -> None:
    """StageSpec.probe: the cli probes the host for a planned stage only; the result is
    facts.probed[name], which planning reads (it never probes itself)."""
    from launcher.cli import probed

    calls = []

    def probe(cfg: Any, facts: Facts) -> str:
        calls.append(cfg.greeting.greeting)
        return "job 4242"

    def plan(ctx: Context) -> tuple[JobSpec, ...]:
        argv = ("echo", ctx.facts.probed["greeting"])
        return (make_job(ctx, stage="greeting", name="greet", argv=argv, resources=Resources()),)

    stages = (*STAGES, StageSpec(name="greeting", config=GreetingConfig, plan=plan, probe=probe))
    cfg = to_schema(compose_config([f"cluster.shared_dir={tmp_path}", "stages=[greeting]"]), stages)
    facts = probed(cfg, FIXED_FACTS, stages)
    assert calls == ["hello"] and facts.probed == {"greeting": "job 4242"}
    assert build_plan(cfg, facts, stages).job("greet").argv == ("echo", "job 4242")
    alone = to_schema(compose_config([f"cluster.shared_dir={tmp_path}", "stages=[data_preparation]"]), stages)
    assert probed(alone, FIXED_FACTS, stages).probed == {} and calls == ["hello"]


def test_training_s_probe_is_the_live_run_init_from_waits_for(make_config: Any, tmp_path: Path) -> None:
    """Without init_from there is nothing to wait for; the probe's result lands under training's name."""
    from launcher.cli import probed

    gpu = ["cluster.gpus_per_node=8", "cluster.backend=slurm", "dry_run=true"]
    cfg = make_config(*gpu, "stages=[training]")
    assert probed(cfg, FIXED_FACTS).probed == {"training": None}
    assert probed(make_config(*gpu, "stages=[data_preparation]"), FIXED_FACTS).probed == {}
