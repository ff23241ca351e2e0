"""What every stage's jobs share: container, environment, cluster flags, CPU-only resources."""

from __future__ import annotations

from pathlib import PurePosixPath

from launcher.config import JobResources, Runtime
from launcher.context import Context
from launcher.discovery import RUN_PLUGINS_VARIABLE
from launcher.errors import ConfigError
from launcher.spec import Array, Container, Dependency, JobSpec, Resources


def job_env(ctx: Context, extra: dict[str, str], with_code: bool) -> tuple[tuple[str, str], ...]:
    """Cluster and user variables; PYTHONPATH only for jobs that run this repo's code (NeMo's own
    script must keep the image's PYTHONPATH). Where plugins are installed, every job names the run
    folder's copy (launcher.discovery reads it), and PYTHONPATH holds it too (a plugin's own programs)."""
    env = {**ctx.cfg.cluster.env, **ctx.cfg.env, **extra}
    plugins = ctx.plugins_dir
    if plugins is not None:
        env[RUN_PLUGINS_VARIABLE] = str(plugins)
    if with_code:
        env["PYTHONPATH"] = ctx.code_dir if plugins is None else f"{ctx.code_dir}:{plugins}"
    return tuple(sorted((str(k), str(v)) for k, v in env.items()))


def container(ctx: Context, names_in_env: tuple[str, ...]) -> Container | None:
    c = ctx.cfg.container
    if c.runtime is Runtime.none:
        return None
    assert c.image, "validated before planning"
    names = sorted(set(names_in_env) | set(c.env_names))
    return Container(
        image=c.image,
        mounts=tuple(c.mounts),
        # pyxis starts the step in this folder inside the container.
        workdir=c.workdir or ctx.code_dir,
        mount_home=c.mount_home,
        env_names=tuple(names),
    )


def option(word: str) -> tuple[str, str | None]:
    """`--name=value` or `--name` as written in YAML -> (name, value)."""
    name, sep, value = word.removeprefix("--").partition("=")
    return name, value if sep else None


def cluster_sbatch_args(ctx: Context) -> tuple[tuple[str, str | None], ...]:
    cl = ctx.cfg.cluster
    named = {"account": cl.account, "qos": cl.qos}
    args = [(name, value) for name, value in named.items() if value]
    return (*args, *(option(word) for word in cl.sbatch_extra_args))


def make_job(
    ctx: Context,
    *,
    stage: str,
    name: str,
    argv: tuple[str, ...],
    resources: Resources,
    array: Array | None = None,
    depends_on: tuple[Dependency, ...] = (),
    sbatch_args: tuple[tuple[str, str | None], ...] = (),
    prologue: tuple[str, ...] = (),
    secret_files: tuple[tuple[str, str], ...] = (),
    singleton: bool = False,
    slurm_name: str | None = None,
    env: dict[str, str] | None = None,
    with_code: bool = True,
) -> JobSpec:
    job_vars = job_env(ctx, env or {}, with_code)
    return JobSpec(
        stage=stage,
        name=name,
        argv=argv,
        resources=resources,
        container=container(ctx, tuple(name for name, _ in job_vars + secret_files)),
        env=job_vars,
        array=array,
        depends_on=depends_on,
        sbatch_args=cluster_sbatch_args(ctx) + sbatch_args,
        srun_args=tuple(ctx.cfg.cluster.srun_extra_args),
        prologue=prologue,
        secret_files=secret_files,
        workdir=ctx.code_dir if ctx.cfg.container.runtime is Runtime.none else None,
        singleton=singleton,
        slurm_name=slurm_name,
    )


def gpu_task_resources(ctx: Context, tasks: int, time: str, mem: str | None) -> Resources:
    """One node, `tasks` tasks of one GPU each and the node's CPUs a GPU; on a cluster without GPUs (local)
    the same tasks run on CPU."""
    cl = ctx.cfg.cluster
    gpus = tasks if cl.gpus_per_node >= 1 else 0
    cpus = max(cl.cpus_per_node // max(cl.gpus_per_node, 1), 1) if cl.cpus_per_node else 1
    return Resources(
        nodes=1,
        ntasks_per_node=tasks,
        cpus_per_task=cpus,
        gpus_per_node=gpus,
        mem=mem,
        time=time,
        partition=cl.partition,
    )


def cpu_resources(ctx: Context, res: JobResources) -> Resources:
    """CPU-only jobs never inherit the GPU/exclusive requests meant for training."""
    cl = ctx.cfg.cluster
    return Resources(
        cpus_per_task=res.cpus_per_task,
        mem=res.mem,
        time=res.time,
        partition=cl.cpu_partition or cl.partition,
    )


def after(*names: str) -> tuple[Dependency, ...]:
    return tuple(Dependency(name) for name in names)


def after_stage(name: str) -> Dependency:
    """Wait for the last jobs of stage `name` if it is planned in this launch (else for nothing)."""
    return Dependency(stage=name)


def inside_mounts(path: str, mounts: list[str]) -> bool:
    """Whether `path` is seen at the same place inside the container."""
    for mount in mounts:
        src, _, rest = mount.partition(":")
        dst = rest.split(":")[0] or src
        if src == dst and PurePosixPath(path).is_relative_to(dst):
            return True
    return False


def require_mounted(
    key: str, path: str, mounts: list[str], remedy: str = "add it to container.mounts"
) -> None:
    """The one refusal of a path that a pyxis job would not see at the same place."""
    if not inside_mounts(path, mounts):
        listed = ", ".join(mounts) or "none"
        raise ConfigError(key, f"{path} is not inside any container mount ({listed}); {remedy}")
