"""The jobs of cached latents (`data_preparation.precache`, the switch itself is launcher.latents).

On, data preparation gains two jobs after the image wdinfo: `encode_latents`, a Slurm array on GPU nodes
in the training container (one task per slice of tars, one process per GPU, NeMo's own frozen VAE and
text encoder built from the training config; data_prep.encode_latents), then `latents_wdinfo`. Here:
the encode step as a NeMo job (launcher.nemo_python finds and checks its interpreter), resources, plan,
and the storage estimate printed before anything runs.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from launcher import latents, nemo_config, nemo_python
from launcher.config import JobResources
from launcher.context import Context
from launcher.families import family_of
from launcher.nemo_python import NemoJob
from launcher.sizing import encode_tasks, planned_rows
from launcher.spec import Array, JobSpec, Resources
from launcher.stages.common import after, after_stage, cpu_resources, make_job

# The encode step builds NeMo's VAE and text encoder: its interpreter is found and checked with every
# other NeMo job's (launcher.nemo_python).
JOB = NemoJob(
    "encode_latents",
    "data_preparation.precache.python",
    off=f"{latents.SWITCH}=false",
    off_means="train from the images",
)
ENCODE_SUFFIX = "_encode.yaml"


def encode_config_files(ctx: Context) -> tuple[tuple[Path, str], ...]:
    """The config the encode step builds NeMo's encoders from, and its family settings: training's own (SD:
    its VAE and text encoder stay in it), or, for a family whose switch replaces the encoders (SDXL's
    caption embedders by the cache's readers: plugins/sdxl/text_cache.py), training's before the switch,
    written beside it."""
    if not family_of(ctx.cfg.training.model).cache.encodes_from_unswitched_config:
        return nemo_config.config_files(ctx)
    path = nemo_config.config_path(ctx)
    return nemo_config.with_family_settings(
        path.with_name(f"{path.stem}{ENCODE_SUFFIX}"), nemo_config.build(ctx, False)
    )


def encode_config_file(ctx: Context) -> tuple[Path, str]:
    return encode_config_files(ctx)[0]


def nemo_jobs(cfg: Any) -> tuple[NemoJob, ...]:
    return (JOB,) if latents.enabled(cfg) else ()


def _encode_resources(ctx: Context) -> Resources:
    """A whole GPU node per array task, one process per GPU; on a cluster without GPUs, one CPU task."""
    cl, pre = ctx.cfg.cluster, ctx.cfg.data_preparation.precache
    if cl.gpus_per_node < 1:
        return cpu_resources(ctx, pre.resources)
    cpus = cl.cpus_per_node // cl.gpus_per_node if cl.cpus_per_node else pre.resources.cpus_per_task
    return Resources(
        nodes=1,
        ntasks_per_node=cl.gpus_per_node,
        cpus_per_task=max(cpus, 1),
        gpus_per_node=cl.gpus_per_node,
        mem=cl.gpu_job_mem,
        time=pre.resources.time,
        exclusive=cl.exclusive_gpu_jobs,
        partition=cl.partition,
    )


def plan(ctx: Context, config_path: Any, last_job: str | None, env: dict[str, str]) -> tuple[JobSpec, ...]:
    """encode_latents (array) then latents_wdinfo, after `last_job` (the image wdinfo); `env` is the
    offline-Hub environment NeMo jobs run with (launcher.nemo_config)."""
    pre, layout = ctx.cfg.data_preparation.precache, ctx.layout
    python = nemo_python.interpreter(ctx.cfg, ctx.facts, JOB)
    device = pre.device or ("cuda" if ctx.cfg.cluster.gpus_per_node >= 1 else "cpu")
    common = ("--input-wdinfo", layout.wdinfo, "--output-dir", layout.latent_tar_dir)
    encode = make_job(
        ctx,
        stage="data_preparation",
        name="encode_latents",
        argv=(
            python,
            "-m",
            "data_prep.encode_latents",
            "encode",
            "--training-config",
            str(config_path),
            "--input-dir",
            str(layout.tar_dir),
            *map(str, common),
            "--batch-size",
            str(pre.batch_size),
            "--device",
            device,
        ),
        resources=_encode_resources(ctx),
        array=Array(encode_tasks(ctx.cfg)),
        depends_on=(*after(*[last_job] if last_job else []), after_stage("assets")),
        env=env,
    )
    wdinfo = make_job(
        ctx,
        stage="data_preparation",
        name="latents_wdinfo",
        argv=ctx.module("data_prep.encode_latents", "wdinfo", *common, "--verify"),
        resources=cpu_resources(ctx, JobResources(cpus_per_task=1, mem="2G", time="00:30:00")),
        depends_on=after(encode.name),
    )
    return encode, wdinfo


def storage_note(cfg: Any) -> str:
    """Bytes per sample and for the planned rows, printed before anything runs."""
    per_sample, what = family_of(cfg.training.model).cache.per_sample(cfg.training.model)
    head = f"precache: {per_sample:,} bytes per sample ({what})"
    rows = planned_rows(cfg)
    if rows is None:
        per_million = per_sample * 1_000_000 / 1e12
        return f"{head}; {per_million:.2f} TB per million rows (rows unknown: set data_preparation.rows_estimate)"
    tars = math.ceil(rows / cfg.data_preparation.reorganize_tar.tar_chunk_size)
    total = rows * per_sample + tars * 10240  # at most one 10 KiB closing record per tar
    return f"{head}; at most {total / 1e9:,.1f} GB for {rows:,} rows in {tars:,} tars"
