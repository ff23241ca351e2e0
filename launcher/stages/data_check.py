"""data_check: NeMo's own SD loader reads the prepared data on CPU before training starts."""

from __future__ import annotations

from launcher.spec import JobSpec, Resources
from launcher.stages import nemo_config
from launcher.stages.common import Context, cpu_resources, make_job

STAGE = "data_check"


def planned_world_size(ctx: Context) -> int:
    """Data-parallel ranks of the training plan (1 on a cluster without GPUs, e.g. local)."""
    if ctx.cfg.cluster.gpus_per_node < 1:
        return 1
    return nemo_config.shape(ctx).world_size


def plan(ctx: Context) -> tuple[JobSpec, ...]:
    dc = ctx.cfg.data_check
    argv = ctx.module(
        "data_prep.data_check",
        "--training-config", nemo_config.config_path(ctx),
        "--world-size", planned_world_size(ctx),
        "--batches", dc.batches,
        "--num-workers", dc.num_workers,
        "--micro-batch-size", dc.micro_batch_size,
        "--report", ctx.run_dir / STAGE / "report.json",
    )  # fmt: skip
    resources: Resources = cpu_resources(ctx, dc.resources)
    return (make_job(ctx, stage=STAGE, name="data_check", argv=argv, resources=resources),)
