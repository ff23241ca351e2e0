"""The rehearsal: the planned training, tiny and on CPU, in its own container, before any GPU job.

One CPU job (`launcher/jobs/rehearsal.py`) with the training job's container, mounts, environment
and secret files reads the NeMo config training will read and runs NeMo's training script on it
(training.run.script: sd_train.py, sd_xl_train.py) with a tiny UNet of the same kind: 2 steps on the
prepared data (or cached latents) with the staged VAE and text encoders, a checkpoint and its resume in
a second process, one sampled image, and training.init_from's UNet checked against the planned one.
What differs by model family (NeMo's model class, its sampler, its CPU-only settings) is the family's
`rehearsal` (launcher/families/family.py). The GPU jobs (training, the benchmark
sweep) wait on it (afterok): a plan only NeMo can refuse fails in minutes of CPU, and Slurm cancels them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from launcher import nemo_config, nemo_python, rehearsal_report
from launcher.config import JobResources
from launcher.context import Context
from launcher.errors import ConfigError
from launcher.families import family_of
from launcher.nemo_python import NemoJob
from launcher.outputs import RehearsalOutputs
from launcher.rules import Text, described, ruled
from launcher.spec import JobSpec
from launcher.stage import DataRole, StageSpec
from launcher.stages.common import cpu_resources, make_job
from launcher.stages.training_job import secret_files_of

NAME = "rehearsal"
JOB = NemoJob(NAME, "rehearsal.python", off=f"{NAME}.enable=false")  # its interpreter: launcher.nemo_python


@dataclass
class RehearsalConfig:
    enable: bool = described(
        False,
        help=(
            "Rehearse the planned training on CPU before the GPU jobs, which wait on it (afterok): NeMo's "
            "training script (sd_train.py, sd_xl_train.py) with a tiny UNet of the same kind, 2 steps on "
            "the prepared data, a checkpoint and its resume, one sampled image. `rehearsal=true` on the "
            "command line is the same."
        ),
    )
    python: str | None = ruled(
        Text(),
        None,
        help="Interpreter with NeMo; null = as data_check's (training.run.python in a container).",
    )
    script: str | None = ruled(
        Text(),
        None,
        help="NeMo's training script that the rehearsal runs (on CPU, its CUDA-only calls replaced); "
        "null = training.run.script.",
    )
    partition: str | None = ruled(
        Text(), None, help="Slurm partition of the job; null = cluster.cpu_partition, else cluster.partition."
    )
    resources: JobResources = field(
        default_factory=lambda: JobResources(cpus_per_task=8, mem="32G", time="01:00:00")
    )


def _sweep_alone(cfg: Any) -> bool:
    """Only the benchmark sweep uses GPUs, on synthetic data: the rehearsal reads none either."""
    return "training" not in cfg.stages and "benchmark" in cfg.stages and cfg.benchmark.synthetic_data


def _synthetic(cfg: Any) -> bool:
    return bool(cfg.training.model.get("data", {}).get("synthetic_data")) or _sweep_alone(cfg)


def plan(ctx: Context) -> tuple[JobSpec, ...]:
    cfg, out = ctx.cfg, RehearsalOutputs(ctx.run_dir)
    rh, tr = cfg.rehearsal, cfg.training
    python = nemo_python.interpreter(cfg, ctx.facts, JOB)
    argv = (
        python,
        "-u",
        "-m",
        "launcher.jobs.rehearsal",
        "--training-config",
        str(nemo_config.config_path(ctx)),
        "--sd-train",
        rh.script or tr.run.script,
        "--workdir",
        str(out.workdir),
        "--report",
        str(out.report),
        "--sample",
        str(out.sample),
        *(("--init-from", tr.init_from) if tr.init_from else ()),
        *(("--synthetic-data",) if _sweep_alone(cfg) else ()),
    )
    resources = cpu_resources(ctx, rh.resources)
    if rh.partition:
        resources = dataclasses.replace(resources, partition=rh.partition)
    job = make_job(
        ctx,
        stage=NAME,
        name=NAME,
        argv=argv,
        resources=resources,
        env=nemo_config.OFFLINE_HUB_ENV,
        secret_files=secret_files_of(ctx),
        with_code=False,
    )
    return (job,)


def _needs(cfg: Any) -> tuple[str, ...]:
    """The staged models, and the prepared data with the data check that guards it (unless synthetic)."""
    return ("assets",) if _synthetic(cfg) else ("assets", "data_preparation", "data_check")


def _check(cfg: Any, planned: frozenset[str]) -> None:
    family = family_of(cfg.training.model)
    refusal = family.rehearsal_refusal or (None if family.rehearsal else "its family declares no `rehearsal`")
    if refusal:
        raise ConfigError(
            "rehearsal.enable",
            f"is true, but {refusal}. Allowed with a {family.title} preset: rehearsal.enable=false",
        )
    nemo_config.check(cfg)


def _notes(ctx: Context) -> tuple[str, ...]:
    waiting = [stage.name for stage in ctx.stages if NAME in stage.needs(ctx.cfg)]
    verb = "waits" if len(waiting) == 1 else "wait"
    after = f"; {' and '.join(waiting)} {verb} on it (afterok)" if waiting else ""
    init = ", training.init_from's UNet checked" if ctx.cfg.training.init_from else ""
    return (
        f"rehearsal: NeMo's training on CPU first, with a tiny UNet of the same kind: 2 steps, a checkpoint and "
        f"its resume, one image{init}{after}; `status` says what it found",
    )


STAGE = StageSpec(
    name=NAME,
    config=RehearsalConfig,
    plan=plan,
    needs=_needs,
    auto=lambda cfg: cfg.rehearsal.enable,
    data_role=DataRole.reads,
    check=_check,
    nemo_jobs=lambda cfg: (JOB,),
    files=nemo_config.config_files,
    notes=_notes,
    status=rehearsal_report.status_lines,
    summary=rehearsal_report.status_lines,
)
