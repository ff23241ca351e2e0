"""Typed schema of what every stage shares: cluster, container, job resources, the run's folders.

Data only. Each stage declares its own section (`cfg.<stage>`) in its module under launcher/stages/, and
launcher/registry.py joins those sections with `CoreConfig` into the root config that the YAML under
`conf/` is merged onto (launcher/validate.py): unknown keys, wrong types and bad enum values fail before
anything is written or submitted.

Every value field declares what it may be, next to it: `x: int = ruled(Range(1), 64)` (see
launcher/rules.py). Booleans and enums need no rule: their type is the whole rule.
tests/test_config_rules.py fails for a new field without one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from omegaconf import MISSING

from launcher.rules import (
    ABS_PATH,
    ENV_NAME,
    MOUNT,
    PATH_COMPONENT,
    SBATCH_FLAG,
    SLURM_MEM,
    Each,
    Keys,
    Range,
    SlurmTime,
    Text,
    ruled,
)


class BackendName(str, Enum):
    local = "local"
    slurm = "slurm"


class Runtime(str, Enum):
    pyxis = "pyxis"
    none = "none"


@dataclass
class ClusterConfig:
    backend: BackendName = BackendName.local
    # A file system every node sees at the same path: default home of data and results.
    shared_dir: str = ruled(ABS_PATH, MISSING)
    partition: str | None = ruled(Text(), None)
    # CPU-only jobs (downloads, tar work) may go to another partition; null = `partition`.
    cpu_partition: str | None = ruled(Text(), None)
    account: str | None = ruled(Text(), None)
    qos: str | None = ruled(Text(), None)
    gpus_per_node: int = ruled(Range(0), 0)
    cpus_per_node: int | None = ruled(Range(1), None)
    # Memory for GPU jobs ("0" = all of the node's memory, as AWS presets use).
    gpu_job_mem: str | None = ruled(SLURM_MEM, None)
    exclusive_gpu_jobs: bool = True
    time_limit: str = ruled(SlurmTime(), "04:00:00")
    sbatch_extra_args: list[str] = ruled(Each(SBATCH_FLAG), factory=list)
    srun_extra_args: list[str] = ruled(Each(SBATCH_FLAG), factory=list)
    # Exported in every job and passed into the container (EFA/NCCL settings for the presets).
    env: dict[str, str] = ruled(Keys(ENV_NAME), factory=dict)
    # Local backend: array tasks run at once (null = cores on this machine).
    local_parallelism: int | None = ruled(Range(1), None)


@dataclass
class ContainerConfig:
    runtime: Runtime = Runtime.none
    # An absolute .sqsh path or a registry reference such as nvcr.io#nvidia/nemo:24.07.
    image: str | None = ruled(Text(), None)
    mounts: list[str] = ruled(Each(MOUNT), factory=list)
    workdir: str | None = ruled(ABS_PATH, None)
    mount_home: bool = False
    # Extra host variables handed over with --container-env (job env vars are always passed).
    env_names: list[str] = ruled(Each(ENV_NAME), factory=list)
    # Interpreter inside the job; null = this launcher's own interpreter (runtime none only).
    python: str | None = ruled(Text(), None)
    # Where this repository's code is seen by the job; null = this checkout's absolute path.
    code_dir: str | None = ruled(ABS_PATH, None)


@dataclass
class JobResources:
    cpus_per_task: int = ruled(Range(1), 2)
    mem: str | None = ruled(SLURM_MEM, "8G")
    time: str = ruled(SlurmTime(), "01:00:00")


@dataclass
class StepConfig:
    enable: bool = True
    resources: JobResources = field(default_factory=JobResources)


@dataclass
class CoreConfig:
    """The top-level keys every run has; launcher.registry adds `stages` and one section per stage."""

    run_name: str = ruled(PATH_COMPONENT, "sd_pretrain")
    base_results_dir: str = ruled(ABS_PATH, MISSING)
    data_dir: str = ruled(ABS_PATH, MISSING)
    dry_run: bool = False
    # Extra environment variables exported in every job.
    env: dict[str, str] = ruled(Keys(ENV_NAME), factory=dict)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    container: ContainerConfig = field(default_factory=ContainerConfig)
