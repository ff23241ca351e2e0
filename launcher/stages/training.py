"""Training: NeMo's sd_train.py (sd_xl_train.py for the SDXL presets: training.run.script), one srun task per GPU, on N
nodes, optionally chained."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from launcher import cost, families, nemo_config, nemo_python, sizing, space, weights
from launcher.context import Context, Facts
from launcher.errors import ConfigError
from launcher.nemo_python import NemoJob
from launcher.outputs import TrainingOutputs
from launcher.quoting import q
from launcher.spec import Dependency, DependencyKind, JobSpec
from launcher.stage import DataRole, StageSpec
from launcher.stages import (
    training_attempts,
    training_faults,
    training_init,
    training_job,
    training_preflight,
    training_record,
    training_recovery,
    training_status,
)
from launcher.stages.common import make_job
from launcher.stages.training_config import TrainingConfig

NAME = "training"


# The nodes of a CPU partition meet over gloo where Lightning's SLURMEnvironment says: MASTER_ADDR/PORT when
# set, else the first name of Slurm's node list, which is not always a host name (it is Slurm's NodeName).
CPU_RENDEZVOUS = (
    "# The processes' rendezvous (gloo): this first node, at a port of this job's own.",
    'MASTER_ADDR="$(hostname)"',
    "MASTER_PORT=$((20000 + SLURM_JOB_ID % 10000))",
    "export MASTER_ADDR MASTER_PORT",
)


def _done_check(ctx: Context) -> tuple[str, ...]:
    """A chained job that starts after max_steps was reached ends at once.

    Finished means a checkpoint at step=max_steps without NeMo's `-unfinished` marker beside it
    (NeMoModelCheckpoint names the marker after the checkpoint less `.ckpt` and `-EMA`).
    """
    max_steps = ctx.cfg.training.trainer.get("max_steps")
    if not max_steps or int(max_steps) < 1:
        return ()
    checkpoints = TrainingOutputs(ctx.run_dir).checkpoints
    return (
        f"for checkpoint in {q(checkpoints)}/*-step={int(max_steps)}-*.ckpt; do",
        '  marker="${checkpoint%.ckpt}"',
        '  if [ -e "$checkpoint" ] && [ ! -e "${marker%-EMA}-unfinished" ]; then',
        f"    echo {q(f'max_steps={max_steps} already reached in {checkpoints}: nothing to do')}",
        "    exit 0",
        "  fi",
        "done",
    )


def plan(ctx: Context) -> tuple[JobSpec, ...]:
    run = ctx.cfg.training.run
    config = nemo_config.config_path(ctx)
    python = nemo_python.interpreter(ctx.cfg, ctx.facts, nemo_job(ctx.cfg))
    program = families.family_of(ctx.cfg.training.model).training_program
    script = (
        *(("-m", program) if program else ()),  # python's, ft_launcher's and the CPU runner's -m alike
        run.script,
        "--config-path",
        str(config.parent),
        "--config-name",
        config.name,
    )
    resources, rendezvous, srun_args = training_job.resources(ctx), (), ()
    if training_recovery.enabled(ctx.cfg):  # each node's ft_launcher starts its ranks
        argv = (*training_recovery.launcher_argv(ctx.cfg, python, config), *script)
        resources = training_recovery.resources(resources)
        rendezvous = training_recovery.RENDEZVOUS
        srun_args = training_recovery.SRUN_ARGS
    elif nemo_config.on_cpu_partition(ctx.cfg):  # NeMo's script with its CUDA/apex-only calls replaced
        argv = (python, "-u", "-m", "launcher.jobs.cpu_training", *script)
        rendezvous = CPU_RENDEZVOUS
    else:
        argv = (python, "-u", *script)
    # No --signal: NeMo stops itself before the limit (exp_manager.max_time_per_run); Lightning's
    # SIGUSR1 handler would write an hpc_ckpt NeMo never resumes from and call scontrol requeue.
    sbatch_args: tuple[tuple[str, str | None], ...] = (("open-mode", "append"),)
    if run.requeue:
        sbatch_args += (("requeue", None),)
    init = training_init.plan(ctx, NAME)
    jobs: list[JobSpec] = []
    for part in range(run.chain):
        name = run.name if run.chain == 1 else f"{run.name}_part{part}"
        if jobs:
            deps = (Dependency(jobs[-1].name, DependencyKind.afterany),)
        else:  # the first part reads the UNet the init job writes
            deps = (Dependency(init.name),) if init else ()
        job = make_job(
            ctx,
            stage=NAME,
            name=name,
            argv=argv,
            resources=resources,
            depends_on=deps,
            sbatch_args=sbatch_args,
            prologue=(*_done_check(ctx), *training_faults.lines(ctx, name, run.name), *rendezvous),
            secret_files=training_job.secret_files_of(ctx),
            singleton=run.chain > 1,
            slurm_name=run.name,
            env=nemo_config.OFFLINE_HUB_ENV,
            with_code=False,
        )
        jobs.append(dataclasses.replace(job, srun_args=(*srun_args, *job.srun_args)))
    return (init, *jobs) if init else tuple(jobs)


def nemo_job(cfg: Any) -> NemoJob:
    """The training job as a NeMo job (launcher.nemo_python): training.run.python is its key."""
    return NemoJob(cfg.training.run.name)


def _nemo_jobs(cfg: Any) -> tuple[NemoJob, ...]:
    return (nemo_job(cfg), *training_init.nemo_jobs(cfg))


def _needs(cfg: Any) -> tuple[str, ...]:
    """The prepared data and the data check that guards it (unless synthetic, or the family reads a source
    of its own), the rehearsal, the staged CLIP and VAE."""
    if not families.family_of(cfg.training.model).reads_prepared_data:
        return ("assets", "rehearsal")
    synthetic = cfg.training.model.get("data", {}).get("synthetic_data")
    data = () if synthetic else ("data_preparation",)
    return ("assets", *data, "data_check", "rehearsal")


def _check_data_read(cfg: Any, planned: frozenset[str]) -> None:
    """Data preparation planned for a training on NeMo's synthetic data, which reads none of it: refused,
    with what it would have cost (a preset's source can be the whole 12.4M-image PD12M)."""
    if "data_preparation" not in planned or not cfg.training.model.get("data", {}).get("synthetic_data"):
        return
    rows = sizing.planned_rows(cfg)
    image = space.per_image_bytes(cfg.data_preparation.download_images.image_size)
    fetched = f"{rows:,} images, about {space.size(rows * image)}" if rows else "a download of unknown size"
    rest = ",".join(name for name in cfg.stages if name != "data_preparation")
    raise ConfigError(
        "stages",
        f"data_preparation would fetch {fetched}, that nothing reads: training.model.data.synthetic_data=true "
        f"trains on random data; plan without it: stages=[{rest}] (or set training.model.data.synthetic_data"
        "=false to train on it)",
    )


def _check_own_source(cfg: Any, planned: frozenset[str]) -> None:
    """Data preparation planned for a family whose training reads a source of its own (Family.
    reads_prepared_data false): refused, naming the stages to plan instead."""
    family = families.family_of(cfg.training.model)
    if "data_preparation" not in planned or family.reads_prepared_data:
        return
    rest = ",".join(name for name in cfg.stages if name != "data_preparation")
    raise ConfigError(
        "stages",
        f"data_preparation makes web-dataset tars that {family.title} training does not read (it reads a data "
        f"source of its own); plan without it: stages=[{rest or 'training'}]",
    )


def _check_cpu_partition(cfg: Any) -> None:
    """On a CPU partition: what the family says a CPU cannot run (SDXL's FSDP), 16-bit autocast (CUDA's), and
    ft_launcher (started around NeMo's script, not around the CPU runner) are refused, each in one line."""
    if not nemo_config.on_cpu_partition(cfg):
        return
    model, trainer = cfg.training.model, cfg.training.trainer
    if not cfg.cluster.cpus_per_node:
        raise ConfigError(
            "cluster.cpus_per_node",
            "null on a CPU partition: each node's one NeMo process would get one CPU; allowed: the CPUs of "
            "a node (all of them go to that process's torch threads)",
        )
    family = families.family_of(model)
    for key, (value, why) in family.rehearsal.cpu_settings.items() if family.rehearsal else ():
        if key in model and model[key] != value:
            raise ConfigError(
                f"training.model.{key}",
                f"{json.dumps(model[key])} on a CPU partition: {why}; allowed: {json.dumps(value)}",
            )
    if str(trainer.get("precision")) in ("16", "16-mixed"):
        raise ConfigError(
            "training.trainer.precision",
            f"{trainer.get('precision')!r} on a CPU partition: 16-bit autocast is CUDA's; allowed: bf16-mixed "
            "(CPU autocast) or 32",
        )
    if training_recovery.enabled(cfg):
        raise ConfigError(
            "training.exp_manager.create_fault_tolerance_callback",
            "true on a CPU partition: ft_launcher would start NeMo's script without the CPU runner; allowed: "
            "false (a failed part is still resubmitted: training.fault_tolerance)",
        )


def _check(cfg: Any, planned: frozenset[str]) -> None:
    _check_data_read(cfg, planned)
    _check_own_source(cfg, planned)
    _check_cpu_partition(cfg)
    nemo_config.check(cfg)
    training_init.check(cfg)
    training_recovery.check(cfg)


def _host_check(cfg: Any, planned: frozenset[str], facts: Facts) -> None:
    training_record.check(cfg)  # one training per run folder
    training_init.host_check(cfg)


def _on_submit(cfg: Any, jobs: tuple[JobSpec, ...]) -> None:
    if jobs:
        training_record.write(cfg)  # the training this folder holds: another is refused (training_record)
        training_attempts.launch_row(cfg)  # the parts' count of attempts without progress starts afresh


def _notes(ctx: Context) -> tuple[str, ...]:
    s = nemo_config.shape(ctx.cfg)
    shape = (
        f"training: {s.nodes} node(s) x {s.gpus_per_node} GPUs = {s.world_size} ranks, "
        f"micro batch {s.micro_batch_size}, global batch {s.global_batch_size}: "
        f"{s.accumulated_micro_batches} micro-batch(es) accumulated per step"
    )
    write_s = training_status.checkpoint_write_s(ctx.run_dir)  # a save this run's logs timed, if any
    return (
        *training_init.notes(ctx, NAME),
        *weights.notes(ctx.cfg),
        shape,
        training_recovery.note(ctx.cfg),
        *cost.notes(ctx.cfg, write_s),
    )


STAGE = StageSpec(
    name=NAME,
    config=TrainingConfig,
    plan=plan,
    needs=_needs,
    gpus=True,
    cpu_partition=True,
    data_role=DataRole.reads,
    check=_check,
    host_check=_host_check,
    nemo_jobs=_nemo_jobs,
    preflight=training_preflight.check,
    probe=training_init.probe,
    on_submit=_on_submit,
    files=nemo_config.config_files,
    notes=_notes,
    status=training_status.status_lines,
)
