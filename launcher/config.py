"""Typed schemas of the launcher's configuration.

Data only: the YAML under `conf/` is composed by Hydra, then merged onto these dataclasses
(`launcher.validate`) so that unknown keys, wrong types and bad enum values fail before anything is
written or submitted. NeMo's own model/trainer/exp_manager sections are free-form here and checked
by the training stage against the keys NeMo reads.

Every value field declares what it may be, next to it: `x: int = ruled(Range(1), 64)` (see
launcher/rules.py). Booleans and enums need no rule: their type is the whole rule.
tests/test_config_rules.py fails for a new field without one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional

from omegaconf import MISSING

from launcher.nemo_values import (
    LIGHTNING_PRECISION,
    NEMO_OPTIMIZERS,
    NEMO_SCHEDULERS,
    SD_BETA_SCHEDULES,
    SD_CONDITIONING_KEYS,
    SD_LOSS_TYPES,
    SD_MODEL_PRECISION,
    SD_PARAMETERIZATIONS,
)
from launcher.rules import (
    ABS_PATH,
    ENV_NAME,
    MOUNT,
    PATH_COMPONENT,
    SBATCH_FLAG,
    SLURM_MEM,
    Choice,
    Each,
    Keys,
    Nested,
    Pattern,
    Range,
    SlurmTime,
    Text,
    ruled,
)


class Backend(str, Enum):
    local = "local"
    slurm = "slurm"


class Runtime(str, Enum):
    pyxis = "pyxis"
    none = "none"


class Stage(str, Enum):
    """Pipeline stages, declared in the order they run."""

    assets = "assets"
    data_preparation = "data_preparation"
    data_check = "data_check"
    # A branch: it waits for the data stages before it, and training never waits for it.
    benchmark = "benchmark"
    training = "training"


@dataclass
class ClusterConfig:
    backend: Backend = Backend.local
    # A file system every node sees at the same path: default home of data and results.
    shared_dir: str = ruled(ABS_PATH, MISSING)
    partition: Optional[str] = ruled(Text(), None)
    # CPU-only jobs (downloads, tar work) may go to another partition; null = `partition`.
    cpu_partition: Optional[str] = ruled(Text(), None)
    account: Optional[str] = ruled(Text(), None)
    qos: Optional[str] = ruled(Text(), None)
    gpus_per_node: int = ruled(Range(0), 0)
    cpus_per_node: Optional[int] = ruled(Range(1), None)
    # Memory for GPU jobs ("0" = all of the node's memory, as AWS presets use).
    gpu_job_mem: Optional[str] = ruled(SLURM_MEM, None)
    exclusive_gpu_jobs: bool = True
    time_limit: str = ruled(SlurmTime(), "04:00:00")
    sbatch_extra_args: list[str] = ruled(Each(SBATCH_FLAG), factory=list)
    srun_extra_args: list[str] = ruled(Each(SBATCH_FLAG), factory=list)
    # Exported in every job and passed into the container (EFA/NCCL settings for the presets).
    env: dict[str, str] = ruled(Keys(ENV_NAME), factory=dict)
    # Local backend: array tasks run at once (null = cores on this machine).
    local_parallelism: Optional[int] = ruled(Range(1), None)


@dataclass
class ContainerConfig:
    runtime: Runtime = Runtime.none
    # An absolute .sqsh path or a registry reference such as nvcr.io#nvidia/nemo:24.07.
    image: Optional[str] = ruled(Text(), None)
    mounts: list[str] = ruled(Each(MOUNT), factory=list)
    workdir: Optional[str] = ruled(ABS_PATH, None)
    mount_home: bool = False
    # Extra host variables handed over with --container-env (job env vars are always passed).
    env_names: list[str] = ruled(Each(ENV_NAME), factory=list)
    # Interpreter inside the job; null = this launcher's own interpreter (runtime none only).
    python: Optional[str] = ruled(Text(), None)
    # Where this repository's code is seen by the job; null = this checkout's absolute path.
    code_dir: Optional[str] = ruled(ABS_PATH, None)


@dataclass
class JobResources:
    cpus_per_task: int = ruled(Range(1), 2)
    mem: Optional[str] = ruled(SLURM_MEM, "8G")
    time: str = ruled(SlurmTime(), "01:00:00")


@dataclass
class StepConfig:
    enable: bool = True
    resources: JobResources = field(default_factory=JobResources)


@dataclass
class DownloadParquetConfig(StepConfig):
    source: str = ruled(Text(), "laion/laion-art")
    # HF commit (or tag/branch) to read; only for an HF source (repo id or hf://datasets/...).
    revision: Optional[str] = ruled(Text(), None)
    pattern: str = ruled(Text(), "*.parquet")
    url_col: str = ruled(Text(), "URL")
    caption_col: str = ruled(Text(), "TEXT")
    min_width: Optional[int] = ruled(Range(0), None)
    min_height: Optional[int] = ruled(Range(0), None)
    # LAION's punsafe/pwatermark are probabilities; its aesthetic score runs from 0 to 10.
    max_punsafe: Optional[float] = ruled(Range(0, 1, integer=False), None)
    max_pwatermark: Optional[float] = ruled(Range(0, 1, integer=False), None)
    min_aesthetic: Optional[float] = ruled(Range(0, 10, integer=False), None)
    # A file holding the HF token (read at run time); HF_TOKEN in the job's environment also works.
    hf_token_file: Optional[str] = ruled(ABS_PATH, None)
    # Keep only the first N rows that pass the filters (a smoke-size run); null = all.
    max_rows: Optional[int] = ruled(Range(1), None)


# img2dataset 1.47.0's default: images whose X-Robots-Tag carries one of these are not downloaded.
ROBOTS_DIRECTIVES = ["noai", "noimageai", "noindex", "noimageindex"]


@dataclass
class DownloadImagesConfig(StepConfig):
    array_throttle: Optional[int] = ruled(Range(1), None)
    image_size: int = ruled(Range(1), 256)
    # img2dataset's resize modes.
    resize_mode: str = ruled(Choice(("no", "border", "keep_ratio", "keep_ratio_largest", "center_crop")), "center_crop")
    # JPEG quality (img2dataset encodes jpg).
    encode_quality: int = ruled(Range(0, 100), 95)
    processes: Optional[int] = ruled(Range(1), None)
    threads: Optional[int] = ruled(Range(1), None)
    samples_per_shard: int = ruled(Range(1), 1000)
    timeout: int = ruled(Range(1), 10)
    retries: int = ruled(Range(0), 0)
    # Added to img2dataset's User-Agent as "(compatible; <token>; +https://github.com/rom1504/img2dataset)".
    user_agent_token: Optional[str] = ruled(Text(), None)
    disallowed_header_directives: list[str] = ruled(Each(Text()), factory=lambda: list(ROBOTS_DIRECTIVES))


# A tar member suffix: joined with ',' on reorganize_tar's command line.
EXTENSION = Pattern(r"[A-Za-z0-9][A-Za-z0-9_.]*", "a file extension such as jpg (letters, digits, '_', '.')")


@dataclass
class ReorganizeTarConfig(StepConfig):
    num_tasks: int = ruled(Range(1), 1)
    tar_chunk_size: int = ruled(Range(1), 1000)
    extensions: list[str] = ruled(Each(EXTENSION, min_items=1), factory=lambda: ["jpg", "txt"])
    keep_remainder: bool = False


@dataclass
class TarsConfig(StepConfig):
    """Bring your own webdataset tars (jpg + txt members): fetched (or linked) in place of the downloads."""

    enable: bool = False
    # A local folder (absolute path) or any fsspec URL (s3://..., hf://datasets/<repo>@<rev>/...).
    source: Optional[str] = ruled(Text(), None)
    pattern: str = ruled(Text(), "*.tar")
    hf_token_file: Optional[str] = ruled(ABS_PATH, None)


@dataclass
class GenerateWdinfoConfig(StepConfig):
    verify: bool = False


@dataclass
class DemoConfig:
    enable: bool = False
    # data_prep.demo needs at least 10 (one of each kind of broken row, and good ones).
    num_images: int = ruled(Range(10), 240)


@dataclass
class DataPreparationConfig:
    num_partitions: int = ruled(Range(1), 64)
    demo: DemoConfig = field(default_factory=DemoConfig)
    download_parquet: DownloadParquetConfig = field(default_factory=DownloadParquetConfig)
    download_images: DownloadImagesConfig = field(default_factory=DownloadImagesConfig)
    tars: TarsConfig = field(default_factory=TarsConfig)
    reorganize_tar: ReorganizeTarConfig = field(default_factory=ReorganizeTarConfig)
    generate_wdinfo: GenerateWdinfoConfig = field(default_factory=GenerateWdinfoConfig)


HUB_REPO_ID = Pattern(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*", "a Hub repo id: owner/name")
COMMIT_SHA = Pattern(r"[0-9a-f]{40}", "a 40-hex commit sha (the repo's History on the Hub): pin one")
REPO_FILE = Pattern(r"(?!-)(?!.*(?:^|/)\.\.(?:/|$))[^/\x00-\x1f][^\x00-\x1f]*",
                    "a file name in the repo (a relative path, no '..', not starting with '-' or '/')")


@dataclass
class AssetConfig:
    """One Hub model repo pinned to a commit; only `files` are fetched, into `local_dir`."""

    repo_id: str = ruled(HUB_REPO_ID, MISSING)
    # A 40-hex commit sha: a branch name would let the files change under a running project.
    revision: str = ruled(COMMIT_SHA, MISSING)
    files: list[str] = ruled(Each(REPO_FILE, min_items=1), factory=list)
    local_dir: str = ruled(ABS_PATH, MISSING)


@dataclass
class AssetsConfig:
    """Pretrained parts of the model that training loads but never trains (CLIP text encoder, VAE)."""

    # Downloaded by one CPU job before data preparation/data_check/training (when those run).
    enable: bool = True
    dir: str = ruled(ABS_PATH, MISSING)
    # A file holding the HF token (read at run time); HF_TOKEN in the job's environment also works.
    hf_token_file: Optional[str] = ruled(ABS_PATH, None)
    text_encoder: AssetConfig = field(default_factory=AssetConfig)
    vae: AssetConfig = field(default_factory=AssetConfig)
    resources: JobResources = field(default_factory=JobResources)


@dataclass
class DataCheckConfig:
    enable: bool = True
    # Interpreter with NeMo; null = training.run.python in a container, else the NeMo venv
    # (.venv-nemo beside this checkout, see requirements-nemo.txt) or this launcher's own.
    python: Optional[str] = ruled(Text(), None)
    batches: int = ruled(Range(1), 4)
    # Also build NeMo's UNet, VAE (staged weights, every key) and text encoder on CPU.
    model_check: bool = True
    # NeMo's loader uses persistent workers: 0 is refused there.
    num_workers: int = ruled(Range(1), 1)
    micro_batch_size: int = ruled(Range(1), 4)
    resources: JobResources = field(default_factory=lambda: JobResources(cpus_per_task=4, mem="16G"))


@dataclass
class TrainingRunConfig:
    name: str = ruled(PATH_COMPONENT, "sd_860m_res_256")
    time_limit: Optional[str] = ruled(SlurmTime(), None)
    # Jobs submitted one after the other (afterany + singleton): K x time_limit of training.
    chain: int = ruled(Range(1), 1)
    script: str = ruled(Text(), "/opt/NeMo/examples/multimodal/text_to_image/stable_diffusion/sd_train.py")
    # NeMo's interpreter (inside the container); null = the job interpreter.
    python: Optional[str] = ruled(Text(), "python3")
    # NeMo stops and checkpoints this long before the job's time limit (exp_manager.max_time_per_run
    # is derived from it); it also covers container start and model build, which NeMo's timer does not count.
    stop_before_limit_s: int = ruled(Range(0), 1200)
    # Slurm may requeue the job after a node failure or preemption; it resumes from its checkpoint.
    requeue: bool = True
    # Secrets are read inside the job from these files; never written into scripts or configs.
    wandb_api_key_file: Optional[str] = ruled(ABS_PATH, None)
    hf_token_file: Optional[str] = ruled(ABS_PATH, None)


# Keys of NeMo's sections that the launcher derives from or that NeMo restricts; the rest of each
# section is NeMo's own and passes through as written (sd_train.yaml's meaning).
TRAINER_RULES = {
    "num_nodes": Range(1),
    "devices": Range(1),
    "precision": Choice(LIGHTNING_PRECISION),
    # Chained jobs and the "already done" check count towards max_steps: it must be a real number
    # of steps (Lightning's -1 = unlimited is refused).
    "max_steps": Range(1),
    "max_epochs": Range(-1),
    "log_every_n_steps": Range(1),
    "gradient_clip_val": Range(0, integer=False),
    "limit_val_batches": Range(0, integer=False),
}
EXP_MANAGER_RULES = {
    # Lightning's ModelCheckpoint refuses negative values (save_top_k: -1 = keep all).
    "checkpoint_callback_params.every_n_train_steps": Range(0),
    "checkpoint_callback_params.save_top_k": Range(-1),
    "ema.decay": Range(0, 1, integer=False),
    "ema.every_n_steps": Range(1),
}
MODEL_RULES = {
    "precision": Choice(SD_MODEL_PRECISION),
    "micro_batch_size": Range(1),
    "global_batch_size": Range(1),
    "timesteps": Range(1),
    "image_size": Range(1),
    "channels": Range(1),
    "parameterization": Choice(SD_PARAMETERIZATIONS),
    "beta_schedule": Choice(SD_BETA_SCHEDULES),
    "loss_type": Choice(SD_LOSS_TYPES),
    "conditioning_key": Choice(SD_CONDITIONING_KEYS),
    "optim.name": Choice(NEMO_OPTIMIZERS),
    "optim.lr": Range(0, integer=False, above_lo=True),
    "optim.weight_decay": Range(0, integer=False),
    "optim.sched.name": Choice(NEMO_SCHEDULERS),
    "optim.sched.warmup_steps": Range(0),
    # NeMo's SD loader uses persistent workers: 0 fails there.
    "data.num_workers": Range(1),
    "data.synthetic_data_length": Range(1),
}


@dataclass
class TrainingConfig:
    run: TrainingRunConfig = field(default_factory=TrainingRunConfig)
    trainer: dict[str, Any] = ruled(Nested(TRAINER_RULES), factory=dict)
    exp_manager: dict[str, Any] = ruled(Nested(EXP_MANAGER_RULES), factory=dict)
    model: dict[str, Any] = ruled(Nested(MODEL_RULES), factory=dict)


@dataclass
class BenchmarkConfig:
    """The throughput sweep: one array per node count over the micro batch sizes (conf/benchmark/)."""

    micro_batch_sizes: list[int] = ruled(Each(Range(1), min_items=1), factory=lambda: [32, 64, 128])
    nodes: list[int] = ruled(Each(Range(1), min_items=1), factory=lambda: [1])
    # Optimizer steps per task; the first warmup_steps are left out of every number.
    max_steps: int = ruled(Range(1), 50)
    warmup_steps: int = ruled(Range(0), 10)
    # NeMo's synthetic data (no dataset, no loader cost); false reads the prepared data under data_dir.
    synthetic_data: bool = True
    time_per_task: str = ruled(SlurmTime(), "00:30:00")
    # Array tasks of one node count running at once (null = as many as Slurm allows).
    array_throttle: Optional[int] = ruled(Range(1), None)
    # Seconds between nvidia-smi samples of GPU memory beside each task.
    memory_sample_s: float = ruled(Range(0, integer=False, above_lo=True), 2.0)
    report_resources: JobResources = field(
        default_factory=lambda: JobResources(cpus_per_task=1, mem="4G", time="00:10:00")
    )


@dataclass
class RootConfig:
    stages: list[Stage] = ruled(Each(Choice(tuple(Stage)), min_items=1), factory=lambda: [Stage.data_preparation])
    run_name: str = ruled(PATH_COMPONENT, "sd_pretrain")
    base_results_dir: str = ruled(ABS_PATH, MISSING)
    data_dir: str = ruled(ABS_PATH, MISSING)
    dry_run: bool = False
    # Extra environment variables exported in every job.
    env: dict[str, str] = ruled(Keys(ENV_NAME), factory=dict)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    container: ContainerConfig = field(default_factory=ContainerConfig)
    assets: AssetsConfig = field(default_factory=AssetsConfig)
    data_preparation: DataPreparationConfig = field(default_factory=DataPreparationConfig)
    data_check: DataCheckConfig = field(default_factory=DataCheckConfig)
    benchmark: BenchmarkConfig = field(default_factory=BenchmarkConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
