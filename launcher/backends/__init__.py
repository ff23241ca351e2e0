"""Backends behind one interface: `schedule(request) -> job ids`.

A `Request` is the printable dry-run object: every rendered script and the sbatch command that
would submit it. Backends are imported lazily by name.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from launcher import manifest
from launcher.render import render, submit_argvs
from launcher.spec import JobSpec, Plan


@dataclass(frozen=True)
class Request:
    plan: Plan
    scripts: tuple[tuple[JobSpec, str], ...]
    # resubmit=missing (launcher.relaunch): the earlier launch's records of the jobs not submitted again,
    # and the ids of its live jobs that the plan's jobs wait on.
    kept: tuple[manifest.JobRecord, ...] = ()
    live_ids: tuple[tuple[str, str], ...] = ()

    def materialize(self, job_ids: dict[str, str] | None = None) -> str:
        parts = []
        for job, text in self.scripts:
            argvs = submit_argvs(self.plan, job, {**dict(self.live_ids), **(job_ids or {})})
            commands = "".join(f"# $ {' '.join(argv)}\n" for argv in argvs)
            parts.append(f"# ---- {job.stage}/{job.name}\n{commands}{text}")
        return "\n".join(parts)

    def __str__(self) -> str:
        return self.materialize()


def prepare(
    plan: Plan, kept: tuple[manifest.JobRecord, ...] = (), live_ids: tuple[tuple[str, str], ...] = ()
) -> Request:
    """Render every job; pure."""
    scripts = tuple((job, render(plan, job)) for job in plan.jobs)
    return Request(plan=plan, scripts=scripts, kept=kept, live_ids=live_ids)


def moved(path: Path, run_dir: Path, into: Path | None) -> Path:
    """`path` of the run folder as written into `into`, a preview folder standing for it (None: itself)."""
    return into / path.relative_to(run_dir) if into is not None and path.is_relative_to(run_dir) else path


def write_files(request: Request, into: Path | None = None) -> None:
    """The scripts and the run's extra files, each written atomically; with `into` (a dry run's preview,
    launcher.preview) there instead of the run folder, and no log folder made."""
    plan = request.plan
    for path, text in plan.files:
        manifest.write_atomic(moved(path, plan.run_dir, into), text)
    for job, text in request.scripts:
        manifest.write_atomic(moved(plan.script_path(job), plan.run_dir, into), text, mode=0o755)
        if into is None:
            plan.log_pattern(job).parent.mkdir(parents=True, exist_ok=True)


def _ids(job: JobSpec, job_ids: dict[str, str]) -> list[str]:
    """A job's submitted ids; an array split into parts has them joined, `12:13:14` (afterok's form)."""
    return job_ids[job.name].split(":") if job_ids.get(job.name) else []


def records(
    request: Request, job_ids: dict[str, str], backend: str, into: Path | None = None
) -> list[manifest.JobRecord]:
    plan = request.plan
    return [*request.kept] + [
        manifest.JobRecord(
            stage=job.stage,
            name=job.name,
            job_id=next(iter(_ids(job, job_ids)), None),
            array=job.array.spec() if job.array else None,
            script=str(moved(plan.script_path(job), plan.run_dir, into)),
            log_pattern=str(plan.log_pattern(job)),
            depends_on=[f"{d.kind.value}:{d.job}" for d in job.depends_on]
            + [f"{d.kind.value}:{d.job_id} ({d.why})" for d in job.after_external],
            backend=backend,
            part_ids=_ids(job, job_ids) if job.array and job.array.part_size else [],
            part_size=job.array.part_size if job.array else None,
        )
        for job in plan.jobs
    ]


class Backend(Protocol):
    name: str

    def schedule(self, request: Request) -> dict[str, str]:
        """Write, submit (or run) every job of the request; return job name -> id."""
        ...

    def cancel(self, run_dir: Path, jobs: list[manifest.JobRecord]) -> str:
        """Stop the run's jobs of this backend that have not ended; what was done, in one line."""
        ...


BACKENDS = {"slurm": "launcher.backends.slurm", "local": "launcher.backends.local"}


def get(name: str, **options: object) -> Backend:
    module = importlib.import_module(BACKENDS[name])
    return module.create(**options)  # type: ignore[no-any-return]
