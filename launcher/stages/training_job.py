"""What every job that runs NeMo's training script gets (training, the benchmark sweep's tasks, the
rehearsal): training's resources and the secret files it reads. Here, not in the training stage, so that
those stages import no other stage."""

from __future__ import annotations

from launcher import nemo_config
from launcher.context import Context
from launcher.spec import Resources


def resources(ctx: Context) -> Resources:
    """One task per GPU; on a CPU partition one task per node with all of its CPUs (cluster.cpus_per_node)."""
    cl = ctx.cfg.cluster
    s = nemo_config.shape(ctx.cfg)
    cpus = (cl.cpus_per_node // s.gpus_per_node) if cl.cpus_per_node else 1
    on_cpus = nemo_config.on_cpu_partition(ctx.cfg)
    return Resources(
        nodes=s.nodes,
        ntasks_per_node=s.gpus_per_node,
        cpus_per_task=max(cpus, 1),
        gpus_per_node=None if on_cpus else s.gpus_per_node,
        mem=cl.gpu_job_mem,
        time=nemo_config.time_limit(ctx.cfg),
        exclusive=cl.exclusive_gpu_jobs,
        partition=(cl.cpu_partition or cl.partition) if on_cpus else cl.partition,
    )


def secret_files_of(ctx: Context) -> tuple[tuple[str, str], ...]:
    """(variable, file) pairs a NeMo job reads at run time."""
    run = ctx.cfg.training.run
    pairs = (("WANDB_API_KEY", run.wandb_api_key_file), ("HF_TOKEN", run.hf_token_file))
    return tuple((name, path) for name, path in pairs if path)
