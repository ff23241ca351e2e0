"""Slurm's limits on a plan: arrays above MaxArraySize are split into parts, a plan above MaxJobCount
is refused. Pure: the limits are a fact read once per launch (launcher.backends.slurm.read_limits).

    >>> from pathlib import Path
    >>> from launcher.spec import Array, JobSpec, Plan, Resources
    >>> job = JobSpec("s", "j", ("true",), Resources(), array=Array(150, 16))
    >>> fit(Plan(Path("/r"), (job,)), SlurmLimits(max_array_size=64)).jobs[0].array.parts()
    ((0, 64), (64, 64), (128, 22))
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from launcher.errors import LauncherError
from launcher.spec import JobSpec, Plan

# Slurm's own defaults (slurm.conf(5)), used by a dry run that cannot ask a cluster.
DEFAULT_MAX_ARRAY_SIZE = 1001
DEFAULT_MAX_JOB_COUNT = 10000
DEFAULT_SOURCE = "Slurm's default"


def user_source(key: str) -> str:
    """The label of a limit the user set: theirs, never the cluster's or Slurm's."""
    return f"your cluster.{key}"


@dataclass(frozen=True)
class SlurmLimits:
    # An array task's index must be below MaxArraySize, so an array holds at most this many tasks.
    max_array_size: int = DEFAULT_MAX_ARRAY_SIZE
    # Jobs the controller holds at once, every array task counted (a pending array included).
    max_job_count: int = DEFAULT_MAX_JOB_COUNT
    # Where each limit came from, printed beside it: the config (user_source), the cluster, Slurm's default.
    array_source: str = DEFAULT_SOURCE
    job_count_source: str = DEFAULT_SOURCE
    # True when max_job_count is Slurm's default, not this cluster's (a dry run without the key): a plan
    # above it is then a warning, since the cluster may well allow more.
    assumed: bool = False


def parse_config(text: str, source: str = "scontrol show config") -> SlurmLimits:
    """MaxArraySize and MaxJobCount from `scontrol show config` (`Name = value` lines)."""
    values = dict(re.findall(r"^(MaxArraySize|MaxJobCount)\s*=\s*(\d+)", text, re.MULTILINE))
    return SlurmLimits(
        int(values.get("MaxArraySize", DEFAULT_MAX_ARRAY_SIZE)),
        int(values.get("MaxJobCount", DEFAULT_MAX_JOB_COUNT)),
        source,
        source,
    )


def _tasks(job: JobSpec) -> int:
    return job.array.size if job.array else 1


def _key(job: JobSpec) -> str:
    key = job.array.key if job.array else None
    return key or f"the task count of {job.stage}/{job.name}"


def job_count_problem(plan: Plan, limits: SlurmLimits) -> str | None:
    """Why the plan's jobs, every array task counted, exceed MaxJobCount, naming the key to change; None
    when they fit. sbatch would refuse (after retrying for a while) every job past the limit."""
    total = sum(_tasks(job) for job in plan.jobs)
    if total <= limits.max_job_count:
        return None
    largest = max(plan.jobs, key=_tasks)
    room = limits.max_job_count - (total - _tasks(largest))
    change = (
        f"lower {_key(largest)} to at most {room} (now {_tasks(largest)})"
        if room >= 1
        else "plan fewer stages per launch"
    )
    return (
        f"the plan holds {total} Slurm jobs counting every array task ({largest.stage}/{largest.name}: "
        f"{_tasks(largest)}), more than MaxJobCount {limits.max_job_count} ({limits.job_count_source}): {change}, "
        "or set cluster.max_job_count if your cluster allows more"
    )


def fit(plan: Plan, limits: SlurmLimits) -> Plan:
    """The plan with every array larger than MaxArraySize marked for submission in parts; refused when
    the cluster cannot hold it at all (job_count_problem; only a warning when the limit is assumed)."""
    problem = job_count_problem(plan, limits)
    if problem and not limits.assumed:
        raise LauncherError(f"{problem}. Nothing was submitted.")
    notes = [f"warning: {problem}"] if problem else []
    jobs = []
    for job in plan.jobs:
        if job.array and job.array.size > limits.max_array_size:
            job = dataclasses.replace(
                job, array=dataclasses.replace(job.array, part_size=limits.max_array_size)
            )
            assert job.array is not None
            order = "one after another (the throttle holds overall)" if job.array.throttle else "at once"
            notes.append(
                f"{job.stage}/{job.name}: {job.array.size} tasks submitted as {len(job.array.parts())} arrays "
                f"of at most {limits.max_array_size} (MaxArraySize, {limits.array_source}), run {order}; "
                "status, logs, cancel and resubmit=missing treat them as one job"
            )
        jobs.append(job)
    return dataclasses.replace(plan, jobs=tuple(jobs), notes=plan.notes + tuple(notes))
