"""The plan model: immutable, backend-neutral job specs with dependency edges."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from launcher.paths import RunPaths


class DependencyKind(str, Enum):
    afterok = "afterok"
    # Chained training jobs continue after their predecessor ends in any state (time limit).
    afterany = "afterany"


@dataclass(frozen=True)
class Dependency:
    """An edge to one job of the plan (`job`), or to the last jobs of another stage (`stage`: a stage's
    `uses`, replaced by launcher.pipeline with edges to those jobs, or dropped when it is not planned)."""

    job: str = ""
    kind: DependencyKind = DependencyKind.afterok
    stage: str | None = None

    def __post_init__(self) -> None:
        if bool(self.job) == bool(self.stage):
            raise ValueError(f"a dependency names a job or a stage, not both or neither: {self}")


@dataclass(frozen=True)
class ExternalDependency:
    """A job outside the plan, by its Slurm id: e.g. the earlier run's training that training.init_from
    waits for. `why` says what it is (shown in the jobs table)."""

    job_id: str
    why: str
    kind: DependencyKind = DependencyKind.afterok


@dataclass(frozen=True)
class Resources:
    nodes: int = 1
    ntasks_per_node: int = 1
    cpus_per_task: int = 1
    gpus_per_node: int = 0
    mem: str | None = None
    time: str = "01:00:00"
    exclusive: bool = False
    partition: str | None = None


@dataclass(frozen=True)
class Container:
    """What pyxis gets on the srun line."""

    image: str
    mounts: tuple[str, ...] = ()
    workdir: str | None = None
    mount_home: bool = False
    env_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class Array:
    size: int
    throttle: int | None = None
    # The config key that sets `size`, named when the cluster cannot hold the plan (launcher.limits).
    key: str | None = None
    # Set by launcher.limits when `size` exceeds the cluster's MaxArraySize: the array is submitted as
    # parts of at most this many tasks, each with its first task's index (docs/relaunch.md).
    part_size: int | None = None

    def spec(self, size: int | None = None) -> str:
        """`0-3%2` style value of `--array` (for `size` tasks: a part's)."""
        span = f"0-{(size or self.size) - 1}"
        return f"{span}%{self.throttle}" if self.throttle else span

    def parts(self) -> tuple[tuple[int, int], ...]:
        """(first task, task count) of each part the array is submitted as; one when not split."""
        step = self.part_size or self.size
        return tuple((first, min(step, self.size - first)) for first in range(0, self.size, step))


@dataclass(frozen=True)
class JobSpec:
    """One Slurm job (or array) of the plan; argv runs in every task through srun."""

    stage: str
    name: str
    argv: tuple[str, ...]
    resources: Resources
    container: Container | None = None
    env: tuple[tuple[str, str], ...] = ()
    array: Array | None = None
    depends_on: tuple[Dependency, ...] = ()
    # Jobs of other runs this one waits for (their ids are known when the plan is made).
    after_external: tuple[ExternalDependency, ...] = ()
    # More sbatch options as (name, value or None for a bare flag): account, qos, requeue...
    sbatch_args: tuple[tuple[str, str | None], ...] = ()
    srun_args: tuple[str, ...] = ()
    # Shell lines run once in the batch step before srun (already-rendered, quoted commands).
    prologue: tuple[str, ...] = ()
    # Names of secret files read at run time into the named env vars: (VAR, path).
    secret_files: tuple[tuple[str, str], ...] = ()
    workdir: str | None = None
    # Slurm's `singleton`: at most one job of this Slurm job name (per user) runs at a time.
    singleton: bool = False
    # Slurm's --job-name when it differs from `name` (which is unique in the plan): chained training
    # parts share one so that `singleton` links them.
    slurm_name: str | None = None


@dataclass(frozen=True)
class Plan:
    run_dir: Path
    jobs: tuple[JobSpec, ...] = field(default_factory=tuple)
    # Extra files the run writes beside the scripts (e.g. the resolved NeMo config): path -> text.
    files: tuple[tuple[Path, str], ...] = ()
    notes: tuple[str, ...] = ()

    def job(self, name: str) -> JobSpec:
        for job in self.jobs:
            if job.name == name:
                return job
        raise KeyError(name)

    def script_path(self, job: JobSpec) -> Path:
        return RunPaths(self.run_dir).script(job.stage, job.name)

    def log_pattern(self, job: JobSpec) -> Path:
        return RunPaths(self.run_dir).log_pattern(job.stage, job.name, job.array is not None)
