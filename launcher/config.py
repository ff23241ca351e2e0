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
    FOLDER,
    MOUNT,
    PATH_COMPONENT,
    SBATCH_FLAG,
    SLURM_MEM,
    Choice,
    Each,
    Keys,
    Range,
    SlurmTime,
    Text,
    described,
    ruled,
)

# The GPU types training's cost line has published figures for (the families' published_rates, launcher.families).
GPU_TYPES = ("H100", "A100")


class BackendName(str, Enum):
    local = "local"
    slurm = "slurm"


class Resubmit(str, Enum):
    """What a launch of a run folder that was launched before submits (launcher.relaunch)."""

    all = "all"  # every job; refused while any job of the run is still queued or running
    missing = "missing"  # only the jobs that did not complete, waiting on those still live


class Runtime(str, Enum):
    pyxis = "pyxis"
    none = "none"


@dataclass
class ClusterConfig:
    backend: BackendName = described(
        BackendName.local,
        help="Where jobs run: `slurm` submits sbatch scripts; `local` runs the same scripts on this machine.",
    )
    shared_dir: str = ruled(
        FOLDER,
        MISSING,
        help="A file system every node sees at the same path (/fsx on AWS): default home of data and results.",
    )
    partition: str | None = ruled(
        Text(), None, help="Slurm partition for every job; null = the cluster's default partition."
    )
    cpu_partition: str | None = ruled(
        Text(), None, help="Partition for CPU-only jobs (downloads, tar work, checks); null = `partition`."
    )
    account: str | None = ruled(Text(), None, help="Slurm account (--account); null = the user's default.")
    qos: str | None = ruled(Text(), None, help="Slurm quality of service (--qos); null = none asked.")
    gpus_per_node: int = ruled(
        Range(0), 0, help="GPUs on each node; 0 = a cluster without GPUs (GPU stages are then refused)."
    )
    gpu_type: str | None = ruled(
        Choice(GPU_TYPES),
        None,
        help="The nodes' GPU model (aws_p5: H100, aws_p4de: A100): training's cost line is estimated for it "
        "alone, and only a benchmark sweep run on it counts as measured; null = one estimate per GPU type "
        "with a published figure, each labelled.",
    )
    efa_devices_per_node: int | None = ruled(
        Range(1),
        None,
        help="EFA devices on each node (aws_p5: 32, aws_p4de: 4): training's node check expects them "
        "(training.fault_tolerance.node_check); null = none expected, not checked.",
    )
    node_mtbf_hours: float | None = ruled(
        Range(0, integer=False, above_lo=True),
        None,
        help="Your figure for this cluster's mean time between failures of one node, in hours: training's "
        "cost line then gives the expected GPU-hours lost to faults and Young/Daly's checkpoint interval "
        "(docs/training.md); null = no failure estimate.",
    )
    cpus_per_node: int | None = ruled(
        Range(1), None, help="CPUs on each node, for the jobs that take a whole node; null = not stated."
    )
    gpu_job_mem: str | None = ruled(
        SLURM_MEM,
        None,
        help='Memory for GPU jobs (--mem); "0" = all of the node\'s memory, as the AWS presets use.',
    )
    exclusive_gpu_jobs: bool = described(True, help="GPU jobs ask for whole nodes (--exclusive).")
    time_limit: str = ruled(
        SlurmTime(), "04:00:00", help="Default Slurm time limit of a job that states none of its own."
    )
    sbatch_extra_args: list[str] = ruled(
        Each(SBATCH_FLAG), factory=list, help="Extra #SBATCH flags for every job, e.g. --reservation=x."
    )
    srun_extra_args: list[str] = ruled(
        Each(SBATCH_FLAG), factory=list, help="Extra flags for every srun line, e.g. --mpi=pmix."
    )
    env: dict[str, str] = ruled(
        Keys(ENV_NAME),
        factory=dict,
        help="Exported in every job and passed into the container (the presets' EFA/NCCL settings).",
    )
    local_parallelism: int | None = ruled(
        Range(1), None, help="Local backend: array tasks run at once; null = the cores of this machine."
    )
    max_array_size: int | None = ruled(
        Range(1),
        None,
        help="Slurm's MaxArraySize (larger arrays are submitted in parts); null = ask the cluster at submit "
        "(scontrol show config), a dry run assumes Slurm's default 1001.",
    )
    max_job_count: int | None = ruled(
        Range(1),
        None,
        help="Slurm's MaxJobCount (a plan with more jobs, every array task counted, is refused); null = ask "
        "the cluster at submit, a dry run assumes Slurm's default 10000.",
    )


@dataclass
class ContainerConfig:
    runtime: Runtime = described(
        Runtime.none,
        help="`pyxis` runs each step in `image` with srun --container-*; `none` runs on the host.",
    )
    image: str | None = ruled(
        Text(), None, help="An absolute .sqsh path or a registry reference such as nvcr.io#nvidia/nemo:24.07."
    )
    mounts: list[str] = ruled(
        Each(MOUNT), factory=list, help="Bind mounts (src:dst[:flags]) added to every containerised step."
    )
    workdir: str | None = ruled(
        ABS_PATH,
        None,
        help="Working directory inside the container, where the jobs start this repository's programs; "
        "null = container.code_dir (the only other value allowed).",
    )
    mount_home: bool = described(
        False, help="Mount the user's home into the container (pyxis --container-mount-home)."
    )
    env_names: list[str] = ruled(
        Each(ENV_NAME),
        factory=list,
        help="Extra host variables handed over with --container-env (job variables always are).",
    )
    python: str | None = ruled(
        Text(),
        None,
        help="Interpreter inside the job; null = this launcher's own interpreter (runtime none only).",
    )
    code_dir: str | None = ruled(
        ABS_PATH,
        None,
        help="Where this repository's code is seen by the job; null = this checkout's absolute path.",
    )


@dataclass
class JobResources:
    cpus_per_task: int = ruled(
        Range(1), 2, help="CPUs of each task (--cpus-per-task); tools size their worker pools from it."
    )
    mem: str | None = ruled(
        SLURM_MEM, "8G", help="Memory of each job (--mem), e.g. 8G; null = the partition's default."
    )
    time: str = ruled(
        SlurmTime(), "01:00:00", help="Time limit of each job (Slurm's forms: MM, HH:MM:SS, D-HH)."
    )


@dataclass
class StepConfig:
    enable: bool = described(True, help="Run this step; off, the later steps read what an earlier run left.")
    resources: JobResources = field(default_factory=JobResources)


@dataclass
class CoreConfig:
    """The top-level keys every run has; launcher.registry adds `stages` and one section per stage."""

    run_name: str = ruled(
        PATH_COMPONENT,
        "${training.run.name}",
        help="The run's folder under base_results_dir: scripts, logs, manifest and checkpoints; by default the "
        "training preset's name, so that each preset trains in its own folder (a run folder holds one training).",
    )
    base_results_dir: str = ruled(FOLDER, MISSING, help="Where run folders are made.")
    data_dir: str = ruled(
        FOLDER, MISSING, help="Where data preparation writes and training reads (parquet, tars, wdinfo)."
    )
    dry_run: bool = described(
        False,
        help="Write every script and the plan into the run folder, print them, submit nothing (nothing is "
        "written where that would create a top-level folder, e.g. /fsx off the cluster).",
    )
    resubmit: Resubmit = described(
        Resubmit.all,
        help="Launching a run folder again: all = every job, refused while any job of the run is queued or "
        "running; missing = only the jobs that did not complete, waiting on the live ones (docs/relaunch.md).",
    )
    env: dict[str, str] = ruled(
        Keys(ENV_NAME), factory=dict, help="Extra environment variables exported in every job."
    )
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    container: ContainerConfig = field(default_factory=ContainerConfig)
