"""Turns a validated config into one Plan: stages in pipeline order, linked by afterok edges."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from launcher.config import RootConfig, Stage
from launcher.spec import Dependency, JobSpec, Plan
from launcher.stages import assets, benchmark, data_check, data_preparation, nemo_config, training
from launcher.stages.common import Context, Facts

Planner = Callable[[Context], tuple[JobSpec, ...]]
PLANNERS: dict[Stage, Planner] = {
    Stage.assets: assets.plan,
    Stage.data_preparation: data_preparation.plan,
    Stage.data_check: data_check.plan,
    Stage.benchmark: benchmark.plan,
    Stage.training: training.plan,
}
# Stages that wait for the stages before them but that no later stage waits for.
BRANCHES = frozenset({Stage.benchmark})


def run_dir(cfg: RootConfig) -> Path:
    return Path(cfg.base_results_dir) / cfg.run_name


def stages_in_order(cfg: RootConfig) -> list[Stage]:
    """Pipeline order whatever order the user typed; data_check guards training unless disabled,
    and the assets they read are staged before anything else."""
    chosen = set(cfg.stages)
    if Stage.training in chosen and cfg.data_check.enable:
        chosen.add(Stage.data_check)
    if assets.needed(cfg):
        chosen.add(Stage.assets)
    return [stage for stage in Stage if stage in chosen]


def _sinks(jobs: tuple[JobSpec, ...]) -> tuple[str, ...]:
    needed = {dep.job for job in jobs for dep in job.depends_on}
    return tuple(job.name for job in jobs if job.name not in needed)


def _link(jobs: tuple[JobSpec, ...], previous: tuple[str, ...]) -> tuple[JobSpec, ...]:
    """The stage's first jobs wait for the previous stage's last jobs to succeed."""
    edges = tuple(Dependency(name) for name in previous)
    return tuple(
        dataclasses.replace(job, depends_on=job.depends_on + edges) if not job.depends_on else job
        for job in jobs
    )


def build_plan(cfg: RootConfig, facts: Facts) -> Plan:
    ctx = Context(cfg=cfg, facts=facts, run_dir=run_dir(cfg))
    stages = stages_in_order(cfg)
    jobs: tuple[JobSpec, ...] = ()
    previous: tuple[str, ...] = ()
    for stage in stages:
        planned = _link(PLANNERS[stage](ctx), previous)
        jobs += planned
        if stage not in BRANCHES:
            previous = _sinks(planned) or previous
    files: tuple[tuple[Path, str], ...] = ()
    notes: tuple[str, ...] = ()
    if Stage.training in stages or Stage.data_check in stages:
        files = ((nemo_config.config_path(ctx), nemo_config.to_yaml(nemo_config.build(ctx))),)
    if Stage.training in stages:
        shape = nemo_config.shape(ctx)
        notes = (
            f"training: {shape.nodes} node(s) x {shape.gpus_per_node} GPUs = {shape.world_size} ranks, "
            f"micro batch {shape.micro_batch_size}, global batch {shape.global_batch_size}: "
            f"{shape.accumulated_micro_batches} micro-batch(es) accumulated per step",
        )
    if Stage.benchmark in stages:
        files += benchmark.files(ctx)
        notes += (benchmark.note(ctx),)
    return Plan(run_dir=ctx.run_dir, jobs=jobs, files=files, notes=notes)
