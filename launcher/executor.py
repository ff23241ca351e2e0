"""A submitit executor configured like the rendered scripts: same cluster preset, pyxis flags on
the srun line, same environment. Python users run their own function in the training container:

    from launcher.executor import make_executor
    ex = make_executor("logs/submitit", "cluster=aws_p5", gpus_per_node=0, cpus_per_task=8)
    job = ex.submit(my_filter, "/fsx/data/parquet")
    print(job.result())

The container's Python must have submitit (the project's Dockerfile installs it).
"""

from __future__ import annotations

import sys
from pathlib import Path

import submitit

from launcher.cli import REPO, compose_config
from launcher.config import Runtime
from launcher.context import Context, Facts
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
) -> submitit.SlurmExecutor:
    """Compose conf/ with `overrides` (e.g. "cluster=aws_p5") and return a ready SlurmExecutor."""
    cfg = to_schema(compose_config(list(overrides)))
    facts = Facts(python=sys.executable, code_dir=str(REPO))
    check_facts(cfg, facts)
    ctx = Context(cfg=cfg, facts=facts, run_dir=Path(folder))
    env = job_env(ctx, {}, with_code=True)
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
        setup=[f"export {name}={q(value)}" for name, value in env],
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
    if cfg.container.runtime is Runtime.none:
        executor.update_parameters(setup=[*executor.parameters["setup"], f"cd {q(ctx.code_dir)}"])
    return executor
