"""Data preparation: [demo source] -> download_parquet -> download_images (array) ->
reorganize_tar (array) -> generate_wdinfo, each edge `afterok` on the whole previous job."""

from __future__ import annotations

from launcher.config import DataPreparationConfig
from launcher.spec import Array, JobSpec
from launcher.stages.common import Context, after, cpu_resources, make_job

STAGE = "data_preparation"


def _optional_flags(pairs: dict[str, object]) -> tuple[str, ...]:
    """`--name value` for every value that is set."""
    out: list[str] = []
    for name, value in pairs.items():
        if value is not None:
            out += [f"--{name}", str(value)]
    return tuple(out)


def _download_parquet_argv(ctx: Context, dp: DataPreparationConfig) -> tuple[str, ...]:
    step = dp.download_parquet
    source = str(ctx.layout.demo_dir / "source") if dp.demo.enable else step.source
    return ctx.module(
        "data_prep.download_parquet",
        "--source", source,
        "--output-dir", ctx.layout.parquet_dir,
        "--num-partitions", dp.num_partitions,
        "--pattern", step.pattern,
        "--url-col", step.url_col,
        "--caption-col", step.caption_col,
        *_optional_flags({
            "min-width": step.min_width,
            "min-height": step.min_height,
            "max-punsafe": step.max_punsafe,
            "max-pwatermark": step.max_pwatermark,
            "min-aesthetic": step.min_aesthetic,
            "hf-token-file": step.hf_token_file,
        }),
    )  # fmt: skip


def _download_images_argv(ctx: Context, dp: DataPreparationConfig) -> tuple[str, ...]:
    step = dp.download_images
    argv = ctx.module(
        "data_prep.download_images",
        "--parquet-dir", ctx.layout.parquet_dir,
        "--output-dir", ctx.layout.raw_tar_dir,
        "--image-size", step.image_size,
        "--resize-mode", step.resize_mode,
        "--encode-quality", step.encode_quality,
        "--samples-per-shard", step.samples_per_shard,
        "--timeout", step.timeout,
        "--retries", step.retries,
        *_optional_flags({"processes": step.processes, "threads": step.threads}),
    )  # fmt: skip
    if not dp.demo.enable:
        return argv
    # The demo's images are served on 127.0.0.1 for the length of each download task.
    return ctx.module("data_prep.serve", "--root", ctx.layout.demo_dir / "images", "--") + argv


def _reorganize_argv(ctx: Context, dp: DataPreparationConfig) -> tuple[str, ...]:
    step = dp.reorganize_tar
    keep = ("--keep-remainder",) if step.keep_remainder else ()
    return ctx.module(
        "data_prep.reorganize_tar",
        "--input-dir", ctx.layout.raw_tar_dir,
        "--output-dir", ctx.layout.tar_dir,
        "--chunk-size", step.tar_chunk_size,
        "--extensions", ",".join(step.extensions),
        *keep,
    )  # fmt: skip


def _wdinfo_argv(ctx: Context, dp: DataPreparationConfig) -> tuple[str, ...]:
    verify = ("--verify",) if dp.generate_wdinfo.verify else ()
    return ctx.module(
        "data_prep.generate_wdinfo",
        "--tar-dir", ctx.layout.tar_dir,
        "--chunk-size", dp.reorganize_tar.tar_chunk_size,
        "--output", ctx.layout.wdinfo,
        *verify,
    )  # fmt: skip


def plan(ctx: Context) -> tuple[JobSpec, ...]:
    dp = ctx.cfg.data_preparation
    steps: list[tuple[str, bool, tuple[str, ...], object, Array | None]] = [
        ("make_demo_source", dp.demo.enable,
         ctx.module("data_prep.demo", "--output-dir", ctx.layout.demo_dir,
                    "--num-images", dp.demo.num_images),
         dp.download_parquet.resources, None),
        ("download_parquet", dp.download_parquet.enable, _download_parquet_argv(ctx, dp),
         dp.download_parquet.resources, None),
        ("download_images", dp.download_images.enable, _download_images_argv(ctx, dp),
         dp.download_images.resources, Array(dp.num_partitions, dp.download_images.array_throttle)),
        ("reorganize_tar", dp.reorganize_tar.enable, _reorganize_argv(ctx, dp),
         dp.reorganize_tar.resources, Array(dp.reorganize_tar.num_tasks)),
        ("generate_wdinfo", dp.generate_wdinfo.enable, _wdinfo_argv(ctx, dp),
         dp.generate_wdinfo.resources, None),
    ]  # fmt: skip
    jobs: list[JobSpec] = []
    for name, enabled, argv, resources, array in steps:
        if not enabled:
            continue
        deps = after(jobs[-1].name) if jobs else ()
        jobs.append(make_job(
            ctx, stage=STAGE, name=name, argv=argv,
            resources=cpu_resources(ctx, resources),  # type: ignore[arg-type]
            array=array, depends_on=deps,
        ))  # fmt: skip
    return tuple(jobs)
