"""data_check: NeMo's own SD loader reads the prepared data on CPU before training starts."""

from __future__ import annotations

from launcher.config import Runtime
from launcher.spec import JobSpec, Resources
from launcher.stages import nemo_config
from launcher.stages.common import Context, cpu_resources, make_job

STAGE = "data_check"


def planned_world_size(ctx: Context) -> int:
    """Data-parallel ranks of the training plan (1 on a cluster without GPUs, e.g. local)."""
    if ctx.cfg.cluster.gpus_per_node < 1:
        return 1
    return nemo_config.shape(ctx).world_size


def nemo_python(ctx: Context) -> str:
    dc, run = ctx.cfg.data_check, ctx.cfg.training.run
    if dc.python:
        return dc.python
    if ctx.cfg.container.runtime is Runtime.pyxis:
        return run.python or ctx.python
    return ctx.facts.nemo_python or ctx.python


def plan(ctx: Context) -> tuple[JobSpec, ...]:
    dc = ctx.cfg.data_check
    argv = (
        nemo_python(ctx), "-m", "data_prep.data_check",
        "--training-config", str(nemo_config.config_path(ctx)),
        "--world-size", str(planned_world_size(ctx)),
        "--batches", str(dc.batches),
        "--num-workers", str(dc.num_workers),
        "--micro-batch-size", str(dc.micro_batch_size),
        "--report", str(ctx.run_dir / STAGE / "report.json"),
        *(("--model-check",) if dc.model_check else ()),
    )  # fmt: skip
    resources: Resources = cpu_resources(ctx, dc.resources)
    return (make_job(ctx, stage=STAGE, name="data_check", argv=argv, resources=resources,
                     env=nemo_config.OFFLINE_HUB_ENV),)
