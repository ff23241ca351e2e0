"""Pure rendering of job specs into sbatch scripts (Jinja only lays out the text)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import jinja2

from launcher.quoting import Raw, flag, q
from launcher.spec import Container, JobSpec, Plan

TEMPLATES = Path(__file__).resolve().parent.parent / "slurm_templates"


@lru_cache(maxsize=1)
def _template() -> jinja2.Template:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    return env.get_template("job.sbatch.j2")


def sbatch_directives(plan: Plan, job: JobSpec) -> list[str]:
    res = job.resources
    flags = [
        flag("job-name", job.slurm_name or job.name),
        flag("output", plan.log_pattern(job)),
        flag("nodes", res.nodes),
        flag("ntasks-per-node", res.ntasks_per_node),
        flag("cpus-per-task", res.cpus_per_task),
        flag("time", res.time),
    ]
    if res.gpus_per_node:
        flags.append(flag("gpus-per-node", res.gpus_per_node))
    if res.mem is not None:
        flags.append(flag("mem", res.mem))
    if res.exclusive:
        flags.append(flag("exclusive"))
    if res.partition:
        flags.append(flag("partition", res.partition))
    if job.array:  # a split array's script names its first part; sbatch gets each part's own --array
        flags.append(flag("array", job.array.spec(job.array.part_size)))
    return sorted(flags + [flag(name, value) for name, value in job.sbatch_args])


def container_options(container: Container | None) -> list[tuple[str, str | None]]:
    """pyxis options as (name, value or None), in the order a person expects to read them."""
    if container is None:
        return []
    options: list[tuple[str, str | None]] = [("container-image", container.image)]
    if container.mounts:
        options.append(("container-mounts", ",".join(container.mounts)))
    if container.workdir:
        options.append(("container-workdir", container.workdir))
    options.append(("container-mount-home" if container.mount_home else "no-container-mount-home", None))
    if container.env_names:
        options.append(("container-env", ",".join(container.env_names)))
    return options


def container_flags(container: Container | None) -> list[str]:
    return [flag(name, value) for name, value in container_options(container)]


def dependency_flags(
    plan: Plan, job: JobSpec, job_ids: dict[str, str], previous_part: str | None = None
) -> list[str]:
    """sbatch flags for the job's edges; unknown ids show as `<name>` placeholders. A job split into
    parts has every part's id (`12:13`); a throttled part waits (afterany) on the previous part."""
    if not job.depends_on and not job.after_external and not job.singleton and not previous_part:
        return []
    by_kind: dict[str, list[str]] = {}
    for dep in job.depends_on:
        by_kind.setdefault(dep.kind.value, []).append(job_ids.get(dep.job, f"<{dep.job}>"))
    for outside in job.after_external:
        by_kind.setdefault(outside.kind.value, []).append(outside.job_id)
    if previous_part:
        by_kind.setdefault("afterany", []).append(previous_part)
    parts = [f"{kind}:{':'.join(ids)}" for kind, ids in by_kind.items()]
    value = ",".join(parts + (["singleton"] if job.singleton else []))
    return [flag("dependency", value), flag("kill-on-invalid-dep", "yes")]


def submit_argv(
    plan: Plan, job: JobSpec, job_ids: dict[str, str], part: int = 0, previous: str | None = None
) -> list[str]:
    """The sbatch command of the job, or of its `part` when the array is split (launcher.limits): that
    part's --array and its first task's index as the script's argument. Parts of a throttled array run
    one after another (each waits on `previous`, the part before) so that the throttle holds overall."""
    script = str(plan.script_path(job))
    if not (job.array and job.array.part_size):
        return ["sbatch", "--parsable", *dependency_flags(plan, job, job_ids), script]
    first, count = job.array.parts()[part]
    chain = (previous or f"<{job.name} part {part}>") if part and job.array.throttle else None
    deps = dependency_flags(plan, job, job_ids, chain)
    return ["sbatch", "--parsable", flag("array", job.array.spec(count)), *deps, script, str(first)]


def submit_argvs(plan: Plan, job: JobSpec, job_ids: dict[str, str]) -> list[list[str]]:
    """Every sbatch command of the job (one per part), ids not known yet as placeholders."""
    return [
        submit_argv(plan, job, job_ids, part) for part in range(len(job.array.parts() if job.array else [0]))
    ]


def array_part_lines(job: JobSpec) -> list[str]:
    """For an array split into parts: the lines that make every step see its task's index in the whole
    array (the programs read SLURM_ARRAY_TASK_ID, _MIN and _COUNT)."""
    if not (job.array and job.array.part_size):
        return []
    size = job.array.size
    return [
        f"# {size} tasks, submitted in parts of at most {job.array.part_size} (the cluster's MaxArraySize);",
        "# sbatch gives each part its first task's index, so every step sees its index in the whole array.",
        'first_task="${1:?give the first task index of this part, as in the sbatch lines above}"',
        "export SLURM_ARRAY_TASK_ID=$((SLURM_ARRAY_TASK_ID + first_task))",
        f"export SLURM_ARRAY_TASK_MIN=0 SLURM_ARRAY_TASK_MAX={size - 1} SLURM_ARRAY_TASK_COUNT={size}",
    ]


def format_command(argv: tuple[str, ...]) -> str:
    """One `--option value` group per line, so a person can read and edit the command; a word after a
    whole `--option=value` starts its own line too (a launcher's options, then the script it runs)."""
    lines: list[list[str]] = [[]]
    for word in argv:
        after_whole = bool(lines[-1]) and lines[-1][-1].startswith("--") and "=" in lines[-1][-1]
        if (word.startswith("--") and lines[-1]) or after_whole:
            lines.append([])
        lines[-1].append(q(word))
    return " \\\n    ".join(" ".join(line) for line in lines)


def render(plan: Plan, job: JobSpec) -> str:
    # Since Slurm 22.05 srun no longer inherits --cpus-per-task from the allocation: without it each
    # task may be bound to one core while it runs its loader workers or img2dataset processes.
    cpus = flag("cpus-per-task", job.resources.cpus_per_task)
    srun_args = [cpus, *(q(arg) for arg in job.srun_args), *container_flags(job.container)]
    resubmit = [" ".join(w for w in argv if w != "--parsable") for argv in submit_argvs(plan, job, {})]
    return _template().render(
        directives=sbatch_directives(plan, job),
        description=f"stage {job.stage}, job {job.name}",
        resubmit=resubmit,
        array_part=array_part_lines(job),
        env=[(name, q(value)) for name, value in job.env],
        secret_files=[(name, q(path)) for name, path in job.secret_files],
        workdir=q(job.workdir) if job.workdir else None,
        prologue=list(job.prologue),
        srun_args=srun_args,
        command=format_command(job.argv),
    )


__all__ = ["Raw", "dependency_flags", "render", "sbatch_directives", "submit_argv", "submit_argvs"]
