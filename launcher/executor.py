"""A submitit executor configured like the rendered scripts: same cluster preset, pyxis flags on
the srun line, same environment. Python users run their own function in the training container:

    from launcher.executor import make_executor
    ex = make_executor("logs/submitit", "cluster=aws_p5", gpus_per_node=0, cpus_per_task=8)
    job = ex.submit(my_filter, "/fsx/data/parquet")
    print(job.result())

The container's Python must have submitit (the project's Dockerfile installs it). On a cluster preset
with the local backend (cluster=local) the function runs on this machine, as the local backend runs
the jobs' scripts: a submitit LocalExecutor with the same environment and working folder. A Slurm
preset on a host without srun is refused in one line (a ConfigError naming `cluster`).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import submitit

from launcher.cli import REPO, compose_config
from launcher.config import BackendName, Runtime
from launcher.context import Context, Facts
from launcher.errors import ConfigError
from launcher.quoting import q
from launcher.render import container_options
from launcher.stages.common import container, job_env
from launcher.validate import check_facts, to_schema


def make_executor(
    folder: str | Path,
    *overrides: str,
    nodes: int = 1,
    gpus_per_node: int = 0,
    cpus_per_task: int = 4,
    timeout_min: int = 60,
    mem: str | None = None,
) -> submitit.SlurmExecutor | submitit.LocalExecutor:
    """Compose conf/ with `overrides` (e.g. "cluster=aws_p5") and return a ready SlurmExecutor, or a
    LocalExecutor on the local backend."""
    cfg = to_schema(compose_config(list(overrides)))
    facts = Facts(python=sys.executable, code_dir=str(REPO))
    check_facts(cfg, facts)
    ctx = Context(cfg=cfg, facts=facts, run_dir=Path(folder))
    env = job_env(ctx, {}, with_code=True)
    setup = [f"export {name}={q(value)}" for name, value in env]
    if cfg.container.runtime is Runtime.none:
        setup.append(f"cd {q(ctx.code_dir)}")
    if cfg.cluster.backend is BackendName.local:
        return _local(folder, ctx.python, setup, nodes, gpus_per_node, timeout_min)
    if shutil.which("srun") is None:  # submitit's own check would say so in a traceback
        raise ConfigError(
            "cluster",
            "cluster.backend=slurm: make_executor submits with Slurm, and srun is not on this host's PATH: "
            "call it on a node of the cluster, or with cluster=local to run the function on this machine",
        )
    pyxis = container(ctx, tuple(name for name, _ in env))
    cl = cfg.cluster
    executor = submitit.SlurmExecutor(folder=folder, python=ctx.python)
    executor.update_parameters(
        nodes=nodes,
        ntasks_per_node=1,
        cpus_per_task=cpus_per_task,
        gpus_per_node=gpus_per_node or None,
        time=timeout_min,
        mem=mem or (cl.gpu_job_mem if gpus_per_node else None),
        partition=cl.partition if gpus_per_node else (cl.cpu_partition or cl.partition),
        account=cl.account,
        qos=cl.qos,
        exclusive=True if gpus_per_node and cl.exclusive_gpu_jobs else None,
        setup=setup,
        # submitit quotes each srun word itself.
        # Slurm >= 22.05: srun takes --cpus-per-task only when given (see launcher.render).
        srun_args=[
            f"--cpus-per-task={cpus_per_task}",
            *cl.srun_extra_args,
            *(
                f"--{name}" + (f"={value}" if value is not None else "")
                for name, value in container_options(pyxis)
            ),
        ],
    )
    return executor


def _local(
    folder: str | Path, python: str, setup: list[str], nodes: int, gpus_per_node: int, timeout_min: int
) -> submitit.LocalExecutor:
    """The function on this machine, in the jobs' environment and folder (as the local backend runs them)."""
    if nodes != 1:
        raise ConfigError("nodes", f"{nodes}; the local backend runs on this one machine: nodes=1")
    executor = submitit.LocalExecutor(folder=folder, python=python)
    executor.update_parameters(setup=setup, gpus_per_node=gpus_per_node, timeout_min=timeout_min)
    return executor
