"""Typed schemas of the launcher's configuration.

Data only: the YAML under `conf/` is composed by Hydra, then merged onto these dataclasses
(`launcher.validate`) so that unknown keys, wrong types and bad enum values fail before anything is
written or submitted. NeMo's own model/trainer/exp_manager sections are free-form here and checked
by the training stage against the keys NeMo reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional

from omegaconf import MISSING


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
    shared_dir: str = MISSING
    partition: Optional[str] = None
    # CPU-only jobs (downloads, tar work) may go to another partition; null = `partition`.
    cpu_partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    gpus_per_node: int = 0
    cpus_per_node: Optional[int] = None
    # Memory for GPU jobs ("0" = all of the node's memory, as AWS presets use).
    gpu_job_mem: Optional[str] = None
    exclusive_gpu_jobs: bool = True
    time_limit: str = "04:00:00"
    sbatch_extra_args: list[str] = field(default_factory=list)
    srun_extra_args: list[str] = field(default_factory=list)
    # Exported in every job and passed into the container (EFA/NCCL settings for the presets).
    env: dict[str, str] = field(default_factory=dict)
    # Local backend: array tasks run at once (null = cores on this machine).
    local_parallelism: Optional[int] = None


@dataclass
class ContainerConfig:
    runtime: Runtime = Runtime.none
    # An absolute .sqsh path or a registry reference such as nvcr.io#nvidia/nemo:24.07.
    image: Optional[str] = None
    mounts: list[str] = field(default_factory=list)
    workdir: Optional[str] = None
    mount_home: bool = False
    # Extra host variables handed over with --container-env (job env vars are always passed).
    env_names: list[str] = field(default_factory=list)
    # Interpreter inside the job; null = this launcher's own interpreter (runtime none only).
    python: Optional[str] = None
    # Where this repository's code is seen by the job; null = this checkout's absolute path.
    code_dir: Optional[str] = None


@dataclass
class JobResources:
    cpus_per_task: int = 2
    mem: Optional[str] = "8G"
    time: str = "01:00:00"


@dataclass
class StepConfig:
    enable: bool = True
    resources: JobResources = field(default_factory=JobResources)


@dataclass
class DownloadParquetConfig(StepConfig):
    source: str = "laion/laion-art"
    # HF commit (or tag/branch) to read; only for an HF source (repo id or hf://datasets/...).
    revision: Optional[str] = None
    pattern: str = "*.parquet"
    url_col: str = "URL"
    caption_col: str = "TEXT"
    min_width: Optional[int] = None
    min_height: Optional[int] = None
    max_punsafe: Optional[float] = None
    max_pwatermark: Optional[float] = None
    min_aesthetic: Optional[float] = None
    # A file holding the HF token (read at run time); HF_TOKEN in the job's environment also works.
    hf_token_file: Optional[str] = None
    # Keep only the first N rows that pass the filters (a smoke-size run); null = all.
    max_rows: Optional[int] = None


# img2dataset 1.47.0's default: images whose X-Robots-Tag carries one of these are not downloaded.
ROBOTS_DIRECTIVES = ["noai", "noimageai", "noindex", "noimageindex"]


@dataclass
class DownloadImagesConfig(StepConfig):
    array_throttle: Optional[int] = None
    image_size: int = 256
    resize_mode: str = "center_crop"
    encode_quality: int = 95
    processes: Optional[int] = None
    threads: Optional[int] = None
    samples_per_shard: int = 1000
    timeout: int = 10
    retries: int = 0
    # Added to img2dataset's User-Agent as "(compatible; <token>; +https://github.com/rom1504/img2dataset)".
    user_agent_token: Optional[str] = None
    disallowed_header_directives: list[str] = field(default_factory=lambda: list(ROBOTS_DIRECTIVES))


@dataclass
class ReorganizeTarConfig(StepConfig):
    num_tasks: int = 1
    tar_chunk_size: int = 1000
    extensions: list[str] = field(default_factory=lambda: ["jpg", "txt"])
    keep_remainder: bool = False


@dataclass
class TarsConfig(StepConfig):
    """Bring your own webdataset tars (jpg + txt members): fetched (or linked) in place of the downloads."""

    enable: bool = False
    # A local folder (absolute path) or any fsspec URL (s3://..., hf://datasets/<repo>@<rev>/...).
    source: Optional[str] = None
    pattern: str = "*.tar"
    hf_token_file: Optional[str] = None


@dataclass
class GenerateWdinfoConfig(StepConfig):
    verify: bool = False


@dataclass
class DemoConfig:
    enable: bool = False
    num_images: int = 240


@dataclass
class DataPreparationConfig:
    num_partitions: int = 64
    demo: DemoConfig = field(default_factory=DemoConfig)
    download_parquet: DownloadParquetConfig = field(default_factory=DownloadParquetConfig)
    download_images: DownloadImagesConfig = field(default_factory=DownloadImagesConfig)
    tars: TarsConfig = field(default_factory=TarsConfig)
    reorganize_tar: ReorganizeTarConfig = field(default_factory=ReorganizeTarConfig)
    generate_wdinfo: GenerateWdinfoConfig = field(default_factory=GenerateWdinfoConfig)


@dataclass
class AssetConfig:
    """One Hub model repo pinned to a commit; only `files` are fetched, into `local_dir`."""

    repo_id: str = MISSING
    # A 40-hex commit sha: a branch name would let the files change under a running project.
    revision: str = MISSING
    files: list[str] = field(default_factory=list)
    local_dir: str = MISSING


@dataclass
class AssetsConfig:
    """Pretrained parts of the model that training loads but never trains (CLIP text encoder, VAE)."""

    # Downloaded by one CPU job before data preparation/data_check/training (when those run).
    enable: bool = True
    dir: str = MISSING
    # A file holding the HF token (read at run time); HF_TOKEN in the job's environment also works.
    hf_token_file: Optional[str] = None
    text_encoder: AssetConfig = field(default_factory=AssetConfig)
    vae: AssetConfig = field(default_factory=AssetConfig)
    resources: JobResources = field(default_factory=JobResources)


@dataclass
class DataCheckConfig:
    enable: bool = True
    # Interpreter with NeMo; null = training.run.python in a container, else the NeMo venv
    # (.venv-nemo beside this checkout, see requirements-nemo.txt) or this launcher's own.
    python: Optional[str] = None
    batches: int = 4
    # Also build NeMo's UNet, VAE (staged weights, every key) and text encoder on CPU.
    model_check: bool = True
    num_workers: int = 1
    micro_batch_size: int = 4
    resources: JobResources = field(default_factory=lambda: JobResources(cpus_per_task=4, mem="16G"))


@dataclass
class TrainingRunConfig:
    name: str = "sd_860m_res_256"
    time_limit: Optional[str] = None
    # Jobs submitted one after the other (afterany + singleton): K x time_limit of training.
    chain: int = 1
    script: str = "/opt/NeMo/examples/multimodal/text_to_image/stable_diffusion/sd_train.py"
    # NeMo's interpreter (inside the container); null = the job interpreter.
    python: Optional[str] = "python3"
    # NeMo stops and checkpoints this long before the job's time limit (exp_manager.max_time_per_run
    # is derived from it); it also covers container start and model build, which NeMo's timer does not count.
    stop_before_limit_s: int = 1200
    # Slurm may requeue the job after a node failure or preemption; it resumes from its checkpoint.
    requeue: bool = True
    # Secrets are read inside the job from these files; never written into scripts or configs.
    wandb_api_key_file: Optional[str] = None
    hf_token_file: Optional[str] = None


@dataclass
class TrainingConfig:
    run: TrainingRunConfig = field(default_factory=TrainingRunConfig)
    trainer: dict[str, Any] = field(default_factory=dict)
    exp_manager: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)


@dataclass
class BenchmarkConfig:
    """The throughput sweep: one array per node count over the micro batch sizes (conf/benchmark/)."""

    micro_batch_sizes: list[int] = field(default_factory=lambda: [32, 64, 128])
    nodes: list[int] = field(default_factory=lambda: [1])
    # Optimizer steps per task; the first warmup_steps are left out of every number.
    max_steps: int = 50
    warmup_steps: int = 10
    # NeMo's synthetic data (no dataset, no loader cost); false reads the prepared data under data_dir.
    synthetic_data: bool = True
    time_per_task: str = "00:30:00"
    # Array tasks of one node count running at once (null = as many as Slurm allows).
    array_throttle: Optional[int] = None
    # Seconds between nvidia-smi samples of GPU memory beside each task.
    memory_sample_s: float = 2.0
    report_resources: JobResources = field(
        default_factory=lambda: JobResources(cpus_per_task=1, mem="4G", time="00:10:00")
    )


@dataclass
class RootConfig:
    stages: list[Stage] = field(default_factory=lambda: [Stage.data_preparation])
    run_name: str = "sd_pretrain"
    base_results_dir: str = MISSING
    data_dir: str = MISSING
    dry_run: bool = False
    # Extra environment variables exported in every job.
    env: dict[str, str] = field(default_factory=dict)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    container: ContainerConfig = field(default_factory=ContainerConfig)
    assets: AssetsConfig = field(default_factory=AssetsConfig)
    data_preparation: DataPreparationConfig = field(default_factory=DataPreparationConfig)
    data_check: DataCheckConfig = field(default_factory=DataCheckConfig)
    benchmark: BenchmarkConfig = field(default_factory=BenchmarkConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
