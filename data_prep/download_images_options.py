"""download_images' options and their command line (the step itself is data_prep.download_images)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

RESIZE_MODES = ("center_crop", "no", "border", "keep_ratio", "keep_ratio_largest")
THREADS_PER_PROCESS = 32  # downloads wait on the network, not the CPU: many per process
ROBOTS_DIRECTIVES = ("noai", "noimageai", "noindex", "noimageindex")  # img2dataset 1.47.0's default


@dataclass(frozen=True)
class ImageOptions:
    """The options that shape the output: a marker made with others is not this partition's."""

    image_size: int = 256
    resize_mode: str = "center_crop"
    encode_quality: int = 95
    samples_per_shard: int = 1000


@dataclass(frozen=True)
class RunOptions:
    parquet_dir: Path
    output_dir: Path
    partition: int
    image: ImageOptions
    processes: int | None = None  # None: this task's CPUs, at most the shards left
    threads: int | None = None  # None: THREADS_PER_PROCESS
    timeout: int = 10
    retries: int = 0
    user_agent_token: str | None = None
    disallowed_header_directives: tuple[str, ...] = ROBOTS_DIRECTIVES


def resize_mode(value: str) -> str:
    if value in RESIZE_MODES:
        return value
    hint = (
        ' (YAML reads an unquoted no as false: write "no")' if value.lower() in ("false", "0", "none") else ""
    )
    raise argparse.ArgumentTypeError(f"{value!r} is not one of {', '.join(RESIZE_MODES)}{hint}")


def default_partition() -> int | None:
    value = os.environ.get("SLURM_ARRAY_TASK_ID")
    return int(value) if value is not None and value.isdigit() else None


def int_at_least(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in [low, high], with a message that says so."""

    def parse(text: str) -> int:
        value = int(text) if text.lstrip("-").isdigit() else None
        if value is None or value < low or (high is not None and value > high):
            allowed = f"{low}..{high}" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"must be an integer {allowed}, got {text!r}")
        return value

    return parse


def add_fetch_options(add: Callable[..., object]) -> None:
    """How an image is fetched and resized: download_images' options, and ControlNet's hints job's, which
    fetches each sample's hint as its image was (launcher/plugins/controlnet/hints.py)."""
    add("--image-size", type=int_at_least(1), default=256, help="side of the stored images (training res)")
    add(
        "--resize-mode",
        type=resize_mode,
        default="center_crop",
        help="center_crop (default: what training does anyway, ~10x less data) or no, border, "
        "keep_ratio, keep_ratio_largest",
    )
    add("--timeout", type=int_at_least(1), default=10, help="seconds per download")
    add("--retries", type=int_at_least(0), default=0, help="extra tries per failed download, at once")
    add("--user-agent-token", help="added to the User-Agent; X-Robots-Tag lines for this token apply too")
    add(
        "--disallowed-header-directives",
        type=directives,
        default=ROBOTS_DIRECTIVES,
        help='comma-separated X-Robots-Tag directives that exclude an image ("" = obey none); '
        f"default {','.join(ROBOTS_DIRECTIVES)}",
    )


def build_parser(description: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m data_prep.download_images",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--parquet-dir", required=True, type=Path, help="download_parquet's output")
    add("--output-dir", required=True, type=Path, help="gets part-%%05d/ and part-%%05d.done.json")
    add(
        "--partition", type=int_at_least(0), default=default_partition(), help="default: $SLURM_ARRAY_TASK_ID"
    )
    add_fetch_options(add)
    add("--encode-quality", type=int_at_least(1, 100), default=95, help="JPEG quality 1..100")
    add(
        "--processes",
        type=int_at_least(1),
        help="img2dataset processes (default: $SLURM_CPUS_PER_TASK or all CPUs, at most the shards left)",
    )
    add(
        "--threads",
        type=int_at_least(1),
        help=f"download threads per process (default {THREADS_PER_PROCESS})",
    )
    add("--samples-per-shard", type=int_at_least(1), default=1000)
    return parser


def directives(text: str) -> tuple[str, ...]:
    return tuple(d.strip().lower() for d in text.split(",") if d.strip())


def parse_options(argv: list[str] | None, description: str | None) -> RunOptions:
    """The command line of `python -m data_prep.download_images` (its --help shows `description`)."""
    parser = build_parser(description)
    args = parser.parse_args(argv)
    if args.partition is None:
        parser.error(
            "--partition: give a partition index >= 0 or run as a Slurm array task (SLURM_ARRAY_TASK_ID)"
        )
    image = ImageOptions(args.image_size, args.resize_mode, args.encode_quality, args.samples_per_shard)
    return RunOptions(
        parquet_dir=args.parquet_dir,
        output_dir=args.output_dir,
        partition=args.partition,
        image=image,
        processes=args.processes,
        threads=args.threads,
        timeout=args.timeout,
        retries=args.retries,
        user_agent_token=args.user_agent_token,
        disallowed_header_directives=args.disallowed_header_directives,
    )
