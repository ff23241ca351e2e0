"""Training: NeMo's sd_train.py, one srun task per GPU, on N nodes, optionally chained."""

from __future__ import annotations

from launcher.quoting import q
from launcher.spec import Dependency, DependencyKind, JobSpec, Resources
from launcher.stages import nemo_config
from launcher.stages.common import Context, make_job

STAGE = "training"


def resources(ctx: Context) -> Resources:
    cl = ctx.cfg.cluster
    s = nemo_config.shape(ctx)
    cpus = (cl.cpus_per_node // s.gpus_per_node) if cl.cpus_per_node else 1
    return Resources(
        nodes=s.nodes,
        ntasks_per_node=s.gpus_per_node,
        cpus_per_task=max(cpus, 1),
        gpus_per_node=s.gpus_per_node,
        mem=cl.gpu_job_mem,
        time=nemo_config.time_limit(ctx),
        exclusive=cl.exclusive_gpu_jobs,
        partition=cl.partition,
    )


def _done_check(ctx: Context) -> tuple[str, ...]:
    """A chained job that starts after max_steps was reached ends at once.

    Finished means a checkpoint at step=max_steps without NeMo's `-unfinished` marker beside it
    (NeMoModelCheckpoint names the marker after the checkpoint less `.ckpt` and `-EMA`).
    """
    max_steps = ctx.cfg.training.trainer.get("max_steps")
    if not max_steps or int(max_steps) < 1:
        return ()
    checkpoints = nemo_config.results_dir(ctx) / "checkpoints"
    return (
        f"for checkpoint in {q(checkpoints)}/*-step={int(max_steps)}-*.ckpt; do",
        '  marker="${checkpoint%.ckpt}"',
        '  if [ -e "$checkpoint" ] && [ ! -e "${marker%-EMA}-unfinished" ]; then',
        f"    echo {q(f'max_steps={max_steps} already reached in {checkpoints}: nothing to do')}",
        "    exit 0",
        "  fi",
        "done",
    )


def secret_files_of(ctx: Context) -> tuple[tuple[str, str], ...]:
    """(variable, file) pairs a NeMo job reads at run time (training and the benchmark sweep)."""
    run = ctx.cfg.training.run
    pairs = (("WANDB_API_KEY", run.wandb_api_key_file), ("HF_TOKEN", run.hf_token_file))
    return tuple((name, path) for name, path in pairs if path)


def plan(ctx: Context) -> tuple[JobSpec, ...]:
    run = ctx.cfg.training.run
    config = nemo_config.config_path(ctx)
    argv = (run.python or ctx.python, "-u", run.script, "--config-path", str(config.parent),
            "--config-name", config.name)  # fmt: skip
    # No --signal: NeMo stops itself before the limit (exp_manager.max_time_per_run); Lightning's
    # SIGUSR1 handler would write an hpc_ckpt NeMo never resumes from and call scontrol requeue.
    sbatch_args: tuple[tuple[str, str | None], ...] = (("open-mode", "append"),)
    if run.requeue:
        sbatch_args += (("requeue", None),)
    jobs: list[JobSpec] = []
    for part in range(run.chain):
        name = run.name if run.chain == 1 else f"{run.name}_part{part}"
        deps = (Dependency(jobs[-1].name, DependencyKind.afterany),) if jobs else ()
        jobs.append(make_job(
            ctx, stage=STAGE, name=name, argv=argv, resources=resources(ctx), depends_on=deps,
            sbatch_args=sbatch_args, prologue=_done_check(ctx), secret_files=secret_files_of(ctx),
            singleton=run.chain > 1, slurm_name=run.name, env=nemo_config.OFFLINE_HUB_ENV, with_code=False,
        ))  # fmt: skip
    return tuple(jobs)
