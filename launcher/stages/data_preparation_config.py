"""Schema of the data_preparation section (conf/data_preparation/): one dataclass per step.

Data only; launcher/stages/data_preparation.py plans the steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.config import JobResources, StepConfig
from launcher.rules import ABS_PATH, Choice, Each, Pattern, Range, Text, described, ruled

# Hub datasets that no longer answer (repo id -> since when): a launch reading one is warned before
# anything is submitted (launcher/preflight.py). Hugging Face answers 403 "Access to this dataset has
# been disabled" for LAION's sets since 2023-12.
GONE_FROM_HUB = {"laion/laion-art": "2023-12"}


@dataclass
class DownloadParquetConfig(StepConfig):
    source: str = ruled(
        Text(),
        "laion/laion-art",
        help="A Hugging Face dataset repo id, an hf://datasets/... URL, or a local folder of parquet.",
    )
    revision: str | None = ruled(
        Text(),
        None,
        help="The Hub commit (or tag/branch) to read; only for a Hub source. Pin a commit for repeatable data.",
    )
    pattern: str = ruled(Text(), "*.parquet", help="Which parquet files of the source to read (a glob).")
    url_col: str = ruled(Text(), "URL", help="The source's column holding image URLs.")
    caption_col: str = ruled(Text(), "TEXT", help="The source's column holding captions.")
    min_width: int | None = ruled(
        Range(0), None, help="Drop rows whose width column is below this; null = no filter."
    )
    min_height: int | None = ruled(
        Range(0), None, help="Drop rows whose height column is below this; null = no filter."
    )
    min_larger_side: int | None = ruled(
        Range(0),
        None,
        help="Drop rows whose larger side (width or height column) is below this: NVIDIA's resolution filter "
        "of the 512 px presets, here before any download; null = no filter.",
    )
    max_punsafe: float | None = ruled(
        Range(0, 1, integer=False),
        None,
        help="Drop rows whose NSFW probability (column punsafe, or COYO's nsfw_score_opennsfw2) is above this; "
        "null = no filter.",
    )
    max_pwatermark: float | None = ruled(
        Range(0, 1, integer=False),
        None,
        help="Drop rows whose watermark probability (column pwatermark, or COYO's watermark_score) is above "
        "this; null = no filter.",
    )
    min_aesthetic: float | None = ruled(
        Range(0, 10, integer=False),
        None,
        help="Drop rows whose aesthetic score (0 to 10: column aesthetic, or COYO's aesthetic_score_laion_v2) "
        "is below this; null = no filter.",
    )
    hf_token_file: str | None = ruled(
        ABS_PATH,
        None,
        help="A file holding the HF token, read at run time (HF_TOKEN in the job's environment also works).",
    )
    max_rows: int | None = ruled(
        Range(1),
        None,
        help="Keep only the first N rows that pass the filters (a smoke-size run); null = all.",
    )
    extra_columns: list[str] = ruled(
        Each(Text()),
        factory=list,
        help="Source columns carried beside url and caption (as strings) into each sample's .json "
        "(img2dataset's save_additional_columns); the training tars keep the .json when "
        "reorganize_tar.extensions names json.",
    )


# img2dataset 1.47.0's default: images whose X-Robots-Tag carries one of these are not downloaded.
ROBOTS_DIRECTIVES = ["noai", "noimageai", "noindex", "noimageindex"]


@dataclass
class DownloadImagesConfig(StepConfig):
    array_throttle: int | None = ruled(
        Range(1), None, help="Download tasks running at once (--array=...%N); null = as many as Slurm allows."
    )
    image_size: int = ruled(
        Range(1), 256, help="Side in pixels of the stored images (the training resolution)."
    )
    resize_mode: str = ruled(
        Choice(("no", "border", "keep_ratio", "keep_ratio_largest", "center_crop")),
        "center_crop",
        help="img2dataset's resize mode.",
    )
    encode_quality: int = ruled(Range(0, 100), 95, help="JPEG quality of the stored images.")
    processes: int | None = ruled(
        Range(1), None, help="img2dataset processes per task; null = the task's CPUs."
    )
    threads: int | None = ruled(
        Range(1), None, help="img2dataset download threads per process; null = its default."
    )
    samples_per_shard: int = ruled(Range(1), 1000, help="Images per tar written by img2dataset.")
    timeout: int = ruled(Range(1), 10, help="Seconds before one image request is given up.")
    retries: int = ruled(Range(0), 0, help="Further tries of a failed image request.")
    user_agent_token: str | None = ruled(
        Text(),
        None,
        help='Added to img2dataset\'s User-Agent as "(compatible; <token>; +https://github.com/rom1504/img2dataset)".',
    )
    disallowed_header_directives: list[str] = ruled(
        Each(Text()),
        factory=lambda: list(ROBOTS_DIRECTIVES),
        help="Images whose X-Robots-Tag carries one of these are not downloaded (img2dataset's default list).",
    )


# A tar member suffix: joined with ',' on reorganize_tar's command line.
EXTENSION = Pattern(r"[A-Za-z0-9][A-Za-z0-9_.]*", "a file extension such as jpg (letters, digits, '_', '.')")


@dataclass
class ReorganizeTarConfig(StepConfig):
    num_tasks: int | None = ruled(
        Range(1),
        None,
        help="Array tasks re-chunking the downloaded tars; null = the planned rows / rows_per_task "
        "(launcher/sizing.py).",
    )
    rows_per_task: int = ruled(
        Range(1), 4_000_000, help="Rows one re-chunking task is sized for when num_tasks is null."
    )
    tar_chunk_size: int = ruled(Range(1), 1000, help="Samples in each training tar.")
    extensions: list[str] = ruled(
        Each(EXTENSION, min_items=1),
        factory=lambda: ["jpg", "txt"],
        help="Tar members a sample must have to be kept (joined with ',' on the command line).",
    )
    keep_remainder: bool = described(
        False, help="Keep the last, smaller tar instead of leaving its samples out."
    )


@dataclass
class TarsConfig(StepConfig):
    """Bring your own webdataset tars (jpg + txt members): fetched (or linked) in place of the downloads."""

    enable: bool = described(
        False, help="Bring your own webdataset tars (jpg + txt members) in place of the downloads."
    )
    source: str | None = ruled(
        Text(),
        None,
        help="A local folder (absolute path) or any fsspec URL (s3://..., hf://datasets/<repo>@<rev>/...).",
    )
    pattern: str = ruled(Text(), "*.tar", help="Which files of the source are tars (a glob).")
    hf_token_file: str | None = ruled(
        ABS_PATH,
        None,
        help="A file holding the HF token, read at run time (HF_TOKEN in the job's environment also works).",
    )


@dataclass
class GenerateWdinfoConfig(StepConfig):
    verify: bool = described(
        False, help="Open every tar and count its samples instead of trusting the re-chunking's index."
    )


@dataclass
class DemoConfig:
    enable: bool = described(
        False,
        help="Make a small dataset on this machine (images served on 127.0.0.1) instead of a Hub source.",
    )
    num_images: int = ruled(
        Range(10),
        240,
        help="Rows of the demo dataset (at least 10: one of each kind of broken row, and good ones).",
    )


@dataclass
class PrecacheConfig:
    """Cached latents (docs/latents.md): encode every image once, then train from the stored latents."""

    enable: bool = described(
        False,
        help="Encode every image once after the wdinfo (GPU array job) and train from the latents; "
        "false trains from the images.",
    )
    num_tasks: int | None = ruled(
        Range(1),
        None,
        help="Array tasks of the encode job, each a GPU node running one process per GPU; null = the "
        "planned rows / rows_per_task (launcher/sizing.py).",
    )
    rows_per_task: int = ruled(
        Range(1), 6_500_000, help="Rows one encode task (one GPU node) is sized for when num_tasks is null."
    )
    batch_size: int = ruled(Range(1), 64, help="Images per VAE call in one encode process.")
    device: str | None = ruled(
        Choice(("cuda", "cpu")), None, help="Where the encoders run; null = cuda with GPUs, cpu without."
    )
    python: str | None = ruled(
        Text(),
        None,
        help="Interpreter with NeMo for the encode step alone; null = training.run.python, else the image's "
        "python3 in a container, else this checkout's .venv-nemo (refused when there is neither).",
    )
    # Time per encode task (on GPU nodes it takes the whole node, like training); cpus/mem for CPU runs.
    resources: JobResources = field(
        default_factory=lambda: JobResources(cpus_per_task=8, mem="32G", time="04:00:00")
    )


@dataclass
class DataPreparationConfig:
    num_partitions: int = ruled(Range(1), 64, help="Parquet partitions, one download array task each.")
    rows_estimate: int | None = ruled(
        Range(1),
        None,
        help="Rows the source holds after its filters: sizes the task counts and the storage estimates "
        "when download_parquet.max_rows is null (demo: demo.num_images); null = unknown.",
    )
    demo: DemoConfig = field(default_factory=DemoConfig)
    download_parquet: DownloadParquetConfig = field(default_factory=DownloadParquetConfig)
    download_images: DownloadImagesConfig = field(default_factory=DownloadImagesConfig)
    tars: TarsConfig = field(default_factory=TarsConfig)
    reorganize_tar: ReorganizeTarConfig = field(default_factory=ReorganizeTarConfig)
    generate_wdinfo: GenerateWdinfoConfig = field(default_factory=GenerateWdinfoConfig)
    precache: PrecacheConfig = field(default_factory=PrecacheConfig)
