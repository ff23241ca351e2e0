"""Turns a validated config into one Plan: each stage's jobs wait (afterok) only on what they read."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from launcher.context import Context, Facts
from launcher.paths import run_dir_of
from launcher.registry import STAGES, needs_of, planned
from launcher.spec import Dependency, JobSpec, Plan
from launcher.stage import StageSpec


def _sinks(jobs: tuple[JobSpec, ...]) -> tuple[str, ...]:
    """The stage's last jobs: those no other job of the stage waits for."""
    needed = {dep.job for job in jobs for dep in job.depends_on}
    return tuple(job.name for job in jobs if job.name not in needed)


def _direct_needs(cfg: Any, stage: StageSpec, present: dict[str, StageSpec]) -> tuple[str, ...]:
    """The planned stages this one needs, less those it already waits for through another of them."""
    planned_stages = tuple(present.values())
    needs = [name for name in needs_of(cfg, stage, planned_stages) if name in present]

    def reaches(name: str, target: str) -> bool:
        return any(
            n == target or reaches(n, target)
            for n in needs_of(cfg, present[name], planned_stages)
            if n in present
        )

    return tuple(n for n in needs if not any(reaches(other, n) for other in needs if other != n))


def _resolve(job: JobSpec, sinks: dict[str, tuple[str, ...]]) -> JobSpec:
    """Edges to a stage (`after_stage(name)`) -> edges to its last jobs (none when it is not planned)."""
    if not any(dep.stage for dep in job.depends_on):
        return job
    deps: list[Dependency] = []
    for dep in job.depends_on:
        names = sinks.get(dep.stage, ()) if dep.stage else (dep.job,)
        deps += [Dependency(name, dep.kind) for name in names]
    return dataclasses.replace(job, depends_on=tuple(deps))


def _link(jobs: tuple[JobSpec, ...], waits_for: tuple[str, ...]) -> tuple[JobSpec, ...]:
    """The stage's first jobs wait for `waits_for` to succeed; its later jobs wait inside the stage."""
    edges = tuple(Dependency(name) for name in waits_for)
    return tuple(job if job.depends_on else dataclasses.replace(job, depends_on=edges) for job in jobs)


def build_plan(cfg: Any, facts: Facts, stages: Sequence[StageSpec] = STAGES) -> Plan:
    """Pure: the validated config (launcher.validate) and the host's facts in, the Plan out."""
    present = {stage.name: stage for stage in planned(cfg, stages)}
    ctx = Context(cfg=cfg, facts=facts, run_dir=run_dir_of(cfg), stages=tuple(present.values()))
    sinks: dict[str, tuple[str, ...]] = {}
    jobs: tuple[JobSpec, ...] = ()
    files: dict[Path, str] = {}
    if ctx.plugins_dir is not None:
        files.update((ctx.plugins_dir / path, text) for path, text in facts.plugins)
    notes: tuple[str, ...] = ()
    for stage in present.values():
        waits_for = tuple(job for need in _direct_needs(cfg, stage, present) for job in sinks[need])
        planned_jobs = tuple(_resolve(job, sinks) for job in _link(stage.plan(ctx), waits_for))
        # A stage without jobs (every step disabled) passes on what it would have waited for.
        sinks[stage.name] = _sinks(planned_jobs) or waits_for
        jobs += planned_jobs
        files.update(stage.files(ctx))
        notes += stage.notes(ctx)
    return Plan(run_dir=ctx.run_dir, jobs=jobs, files=tuple(files.items()), notes=notes)
