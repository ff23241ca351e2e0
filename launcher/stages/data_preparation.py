"""Data preparation: [demo source] -> download_parquet -> download_images (array) ->
reorganize_tar (array) -> generate_wdinfo, each edge `afterok` on the whole previous job.

Bring-your-own tars (`data_preparation=webdataset_tars`): fetch_tars -> reorganize_tar ->
generate_wdinfo; the two download steps must then be disabled (the preset does it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from data_prep.img2dataset_fields import RESERVED_COLUMNS
from launcher import latents, nemo_config, sizing
from launcher.config import BackendName, Runtime
from launcher.context import Context, Facts
from launcher.errors import ConfigError
from launcher.space import free_space_warning
from launcher.spec import Array, JobSpec
from launcher.stage import DataRole, StageSpec
from launcher.stages import precache
from launcher.stages.common import after, cpu_resources, make_job, require_mounted
from launcher.stages.data_preparation_config import GONE_FROM_HUB, DataPreparationConfig

NAME = "data_preparation"


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
        "--source",
        source,
        "--output-dir",
        ctx.layout.parquet_dir,
        "--num-partitions",
        dp.num_partitions,
        "--pattern",
        step.pattern,
        "--url-col",
        step.url_col,
        "--caption-col",
        step.caption_col,
        *_optional_flags(
            {
                "revision": step.revision,
                "max-rows": step.max_rows,
                "min-width": step.min_width,
                "min-height": step.min_height,
                "min-larger-side": step.min_larger_side,
                "max-punsafe": step.max_punsafe,
                "max-pwatermark": step.max_pwatermark,
                "min-aesthetic": step.min_aesthetic,
                "hf-token-file": step.hf_token_file,
                "extra-columns": ",".join(step.extra_columns) or None,
            }
        ),
    )


def _download_images_argv(ctx: Context, dp: DataPreparationConfig) -> tuple[str, ...]:
    step = dp.download_images
    argv = ctx.module(
        "data_prep.download_images",
        "--parquet-dir",
        ctx.layout.parquet_dir,
        "--output-dir",
        ctx.layout.raw_tar_dir,
        "--image-size",
        step.image_size,
        "--resize-mode",
        step.resize_mode,
        "--encode-quality",
        step.encode_quality,
        "--samples-per-shard",
        step.samples_per_shard,
        "--timeout",
        step.timeout,
        "--retries",
        step.retries,
        "--disallowed-header-directives",
        ",".join(step.disallowed_header_directives),
        *_optional_flags(
            {"processes": step.processes, "threads": step.threads, "user-agent-token": step.user_agent_token}
        ),
    )
    if not dp.demo.enable:
        return argv
    # The demo's images are served on 127.0.0.1 for the length of each download task.
    return ctx.module("data_prep.serve", "--root", ctx.layout.demo_dir / "images", "--") + argv


def _fetch_tars_argv(ctx: Context, dp: DataPreparationConfig) -> tuple[str, ...]:
    tars = dp.tars
    return ctx.module(
        "data_prep.fetch_tars",
        "--source",
        tars.source,
        "--output-dir",
        ctx.layout.source_tar_dir,
        "--pattern",
        tars.pattern,
        *_optional_flags({"hf-token-file": tars.hf_token_file}),
    )


def _reorganize_argv(ctx: Context, dp: DataPreparationConfig) -> tuple[str, ...]:
    step = dp.reorganize_tar
    keep = ("--keep-remainder",) if step.keep_remainder else ()
    return ctx.module(
        "data_prep.reorganize_tar",
        "--input-dir",
        ctx.layout.source_tar_dir if dp.tars.enable else ctx.layout.raw_tar_dir,
        "--output-dir",
        ctx.layout.tar_dir,
        "--chunk-size",
        step.tar_chunk_size,
        "--extensions",
        ",".join(step.extensions),
        *keep,
    )


def _wdinfo_argv(ctx: Context, dp: DataPreparationConfig) -> tuple[str, ...]:
    verify = ("--verify",) if dp.generate_wdinfo.verify else ()
    return ctx.module(
        "data_prep.generate_wdinfo",
        "--tar-dir",
        ctx.layout.tar_dir,
        "--chunk-size",
        dp.reorganize_tar.tar_chunk_size,
        "--output",
        ctx.layout.wdinfo,
        *verify,
    )


def _check(cfg: Any, planned: frozenset[str]) -> None:
    """Rules between the data sources' settings (the schema checks types)."""
    dp, key = cfg.data_preparation, "data_preparation"
    reserved = sorted(set(map(str.lower, dp.download_parquet.extra_columns)) & RESERVED_COLUMNS)
    if reserved:
        raise ConfigError(
            f"{key}.download_parquet.extra_columns",
            f"{', '.join(reserved)}: img2dataset writes these fields of each sample's .json itself; allowed: "
            f"any other source column (not {', '.join(sorted(RESERVED_COLUMNS))})",
        )
    if not dp.tars.enable:
        return
    if not dp.tars.source:
        raise ConfigError(f"{key}.tars.source", "required with tars.enable: a folder or fsspec URL of tars")
    local = "://" not in dp.tars.source
    if local and not dp.tars.source.startswith("/"):
        raise ConfigError(
            f"{key}.tars.source",
            f"{dp.tars.source!r}: give an absolute folder (jobs start elsewhere) or an fsspec URL such as "
            "s3://bucket/tars/",
        )
    if cfg.container.runtime is Runtime.pyxis and local:
        remedy = "the jobs read it through links; add it to container.mounts"
        require_mounted(f"{key}.tars.source", dp.tars.source, cfg.container.mounts, remedy)
    steps = {
        "download_parquet": dp.download_parquet.enable,
        "download_images": dp.download_images.enable,
        "demo": dp.demo.enable,
    }
    enabled = [name for name, on in steps.items() if on]
    if enabled:
        raise ConfigError(
            f"{key}.tars.enable",
            f"your own tars replace the downloads, but {', '.join(enabled)} enabled too: use "
            "data_preparation=webdataset_tars (it disables them)",
        )


def plan(ctx: Context) -> tuple[JobSpec, ...]:
    dp = ctx.cfg.data_preparation
    steps: list[tuple[str, bool, tuple[str, ...], object, Array | None]] = [
        (
            "make_demo_source",
            dp.demo.enable,
            ctx.module(
                "data_prep.demo", "--output-dir", ctx.layout.demo_dir, "--num-images", dp.demo.num_images
            ),
            dp.download_parquet.resources,
            None,
        ),
        (
            "download_parquet",
            dp.download_parquet.enable,
            _download_parquet_argv(ctx, dp),
            dp.download_parquet.resources,
            None,
        ),
        (
            "download_images",
            dp.download_images.enable,
            _download_images_argv(ctx, dp),
            dp.download_images.resources,
            Array(dp.num_partitions, dp.download_images.array_throttle, key=f"{NAME}.num_partitions"),
        ),
        ("fetch_tars", dp.tars.enable, _fetch_tars_argv(ctx, dp), dp.tars.resources, None),
        (
            "reorganize_tar",
            dp.reorganize_tar.enable,
            _reorganize_argv(ctx, dp),
            dp.reorganize_tar.resources,
            Array(sizing.reorganize_tasks(ctx.cfg)),
        ),
        (
            "generate_wdinfo",
            dp.generate_wdinfo.enable,
            _wdinfo_argv(ctx, dp),
            dp.generate_wdinfo.resources,
            None,
        ),
    ]
    jobs: list[JobSpec] = []
    for name, enabled, argv, resources, array in steps:
        if not enabled:
            continue
        deps = after(jobs[-1].name) if jobs else ()
        jobs.append(
            make_job(
                ctx,
                stage=NAME,
                name=name,
                argv=argv,
                resources=cpu_resources(ctx, resources),  # type: ignore[arg-type]
                array=array,
                depends_on=deps,
            )
        )
    if latents.enabled(ctx.cfg):
        last = jobs[-1].name if jobs else None
        jobs += precache.plan(ctx, precache.encode_config_file(ctx)[0], last, nemo_config.OFFLINE_HUB_ENV)
    return tuple(jobs)


def _check_all(cfg: Any, planned: frozenset[str]) -> None:
    _check(cfg, planned)
    latents.check(cfg)


def _host_check(cfg: Any, planned: frozenset[str], facts: Facts) -> None:
    _require_tars_source(cfg)


def _require_tars_source(cfg: Any) -> None:
    """A local tars.source that this host would see is refused when missing, not in fetch_tars' log: the
    local backend's jobs run here, and a cluster's shared file system (/fsx) is seen when its top folder
    is. URLs (hf://, s3://) are left to the job."""
    tars = cfg.data_preparation.tars
    if not tars.enable or not tars.source or "://" in tars.source:
        return
    source = Path(tars.source)
    seen = cfg.cluster.backend is BackendName.local or Path(*source.parts[:2]).is_dir()
    if seen and not source.exists():
        raise ConfigError(
            "data_preparation.tars.source",
            f"{source}: no such folder on this host; allowed: an existing absolute folder of tars, or an "
            "fsspec URL such as s3://bucket/tars/ or hf://datasets/<repo>/",
        )


def _gone_from_hub(cfg: Any) -> str | None:
    """A source that is a Hub dataset gone from the Hub (a copy's folder or URL is never warned)."""
    dp = cfg.data_preparation
    if dp.demo.enable or dp.tars.enable or not dp.download_parquet.enable:
        return None
    source = dp.download_parquet.source
    repo = source.removeprefix("hf://datasets/").partition("@")[0].strip("/")
    if repo not in GONE_FROM_HUB:
        return None
    return (
        f"data_preparation.download_parquet.source: {source} is gone from the Hugging Face Hub since "
        f"{GONE_FROM_HUB[repo]} (it answers 403, access disabled), so download_parquet will fail: point "
        "it at your copy (a folder of its parquet files, or an fsspec URL such as s3://bucket/laion-art/); "
        "see docs/datasets.md"
    )


def _warnings(cfg: Any, planned: frozenset[str]) -> tuple[str, ...]:
    return tuple(w for w in (free_space_warning(cfg), _gone_from_hub(cfg)) if w)


def _files(ctx: Context) -> tuple[tuple[Path, str], ...]:
    """The encode step builds NeMo's encoders from the training config (precache.encode_config_file)."""
    if not latents.enabled(ctx.cfg):
        return ()
    return precache.encode_config_files(ctx)


def _notes(ctx: Context) -> tuple[str, ...]:
    encode = latents.enabled(ctx.cfg)
    return (*sizing.notes(ctx.cfg, encode), *((precache.storage_note(ctx.cfg),) if encode else ()))


STAGE = StageSpec(
    name=NAME,
    config=DataPreparationConfig,
    plan=plan,
    # The encode step (precache) reads the staged VAE and CLIP; the downloads do not wait for them.
    uses=lambda cfg: ("assets",) if latents.enabled(cfg) else (),
    data_role=DataRole.writes,
    check=_check_all,
    host_check=_host_check,
    nemo_jobs=precache.nemo_jobs,
    warnings=_warnings,
    files=_files,
    notes=_notes,
)
