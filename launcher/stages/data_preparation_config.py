"""Schema of the data_preparation section (conf/data_preparation/): one dataclass per step.

Data only; launcher/stages/data_preparation.py plans the steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.config import JobResources, StepConfig
from launcher.rules import ABS_PATH, Choice, Each, Pattern, Range, Text, ruled


@dataclass
class DownloadParquetConfig(StepConfig):
    source: str = ruled(Text(), "laion/laion-art")
    # HF commit (or tag/branch) to read; only for an HF source (repo id or hf://datasets/...).
    revision: str | None = ruled(Text(), None)
    pattern: str = ruled(Text(), "*.parquet")
    url_col: str = ruled(Text(), "URL")
    caption_col: str = ruled(Text(), "TEXT")
    min_width: int | None = ruled(Range(0), None)
    min_height: int | None = ruled(Range(0), None)
    # LAION's punsafe/pwatermark are probabilities; its aesthetic score runs from 0 to 10.
    max_punsafe: float | None = ruled(Range(0, 1, integer=False), None)
    max_pwatermark: float | None = ruled(Range(0, 1, integer=False), None)
    min_aesthetic: float | None = ruled(Range(0, 10, integer=False), None)
    # A file holding the HF token (read at run time); HF_TOKEN in the job's environment also works.
    hf_token_file: str | None = ruled(ABS_PATH, None)
    # Keep only the first N rows that pass the filters (a smoke-size run); null = all.
    max_rows: int | None = ruled(Range(1), None)


# img2dataset 1.47.0's default: images whose X-Robots-Tag carries one of these are not downloaded.
ROBOTS_DIRECTIVES = ["noai", "noimageai", "noindex", "noimageindex"]


@dataclass
class DownloadImagesConfig(StepConfig):
    array_throttle: int | None = ruled(Range(1), None)
    image_size: int = ruled(Range(1), 256)
    # img2dataset's resize modes.
    resize_mode: str = ruled(
        Choice(("no", "border", "keep_ratio", "keep_ratio_largest", "center_crop")), "center_crop"
    )
    # JPEG quality (img2dataset encodes jpg).
    encode_quality: int = ruled(Range(0, 100), 95)
    processes: int | None = ruled(Range(1), None)
    threads: int | None = ruled(Range(1), None)
    samples_per_shard: int = ruled(Range(1), 1000)
    timeout: int = ruled(Range(1), 10)
    retries: int = ruled(Range(0), 0)
    # Added to img2dataset's User-Agent as "(compatible; <token>; +https://github.com/rom1504/img2dataset)".
    user_agent_token: str | None = ruled(Text(), None)
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
    source: str | None = ruled(Text(), None)
    pattern: str = ruled(Text(), "*.tar")
    hf_token_file: str | None = ruled(ABS_PATH, None)


@dataclass
class GenerateWdinfoConfig(StepConfig):
    verify: bool = False


@dataclass
class DemoConfig:
    enable: bool = False
    # data_prep.demo needs at least 10 (one of each kind of broken row, and good ones).
    num_images: int = ruled(Range(10), 240)


@dataclass
class PrecacheConfig:
    enable: bool = False
    # Array tasks of the encode job, each one GPU node running one process per GPU.
    num_tasks: int = ruled(Range(1), 1)
    # Images per VAE call on one GPU.
    batch_size: int = ruled(Range(1), 64)
    # Where NeMo's VAE and text encoder run: null = cuda on a cluster with GPUs, cpu without.
    device: str | None = ruled(Choice(("cuda", "cpu")), None)
    # Rows the source holds, for the storage estimate when download_parquet.max_rows is null.
    rows_estimate: int | None = ruled(Range(1), None)
    # NeMo's interpreter without a container (local backend); null = training.run.python in a
    # container, else the NeMo venv beside this checkout (.venv-nemo).
    python: str | None = ruled(Text(), None)
    # Time per encode task (on GPU nodes it takes the whole node, like training); cpus/mem for CPU runs.
    resources: JobResources = field(
        default_factory=lambda: JobResources(cpus_per_task=8, mem="32G", time="04:00:00")
    )


@dataclass
class DataPreparationConfig:
    num_partitions: int = ruled(Range(1), 64)
    demo: DemoConfig = field(default_factory=DemoConfig)
    download_parquet: DownloadParquetConfig = field(default_factory=DownloadParquetConfig)
    download_images: DownloadImagesConfig = field(default_factory=DownloadImagesConfig)
    tars: TarsConfig = field(default_factory=TarsConfig)
    reorganize_tar: ReorganizeTarConfig = field(default_factory=ReorganizeTarConfig)
    generate_wdinfo: GenerateWdinfoConfig = field(default_factory=GenerateWdinfoConfig)
    # Cached latents: encode every image once after the wdinfo; training then reads the latents.
    precache: PrecacheConfig = field(default_factory=PrecacheConfig)
