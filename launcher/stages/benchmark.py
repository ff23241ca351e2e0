"""benchmark: a throughput sweep of NeMo's own training, and a report after it.

Per node count one array job over the micro batch sizes; task i runs `launcher.jobs.bench_task`, which
starts the preset's NeMo script (training.run.script: sd_train.py, or sd_xl_train.py for SDXL), on
synthetic data where the trained family has it (else the prepared data: launcher.families), with the
case's config (the resolved training config plus only the sweep's values) and samples GPU memory beside
it. A report job follows all arrays whatever their state (afterany): an out-of-memory task is a result,
not a reason to cancel the report.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from launcher import nemo_config, nemo_python
from launcher.bench.cases import Case, Sweep, bench_dir, config_path, task_dir
from launcher.config import BackendName, JobResources
from launcher.context import Context
from launcher.errors import ConfigError
from launcher.families import family_of
from launcher.nemo_python import NemoJob
from launcher.outputs import BenchmarkOutputs
from launcher.rules import Choice, Each, Range, SlurmTime, described, ruled, slurm_time_seconds
from launcher.spec import Array, Dependency, DependencyKind, JobSpec, Resources
from launcher.stage import DataRole, Findings, StageSpec
from launcher.stages import training_job, training_preflight
from launcher.stages.common import cpu_resources, make_job

NAME = "benchmark"
# Its tasks run sd_train.py: NeMo's interpreter, training.run.python (launcher.nemo_python).
SWEEP = NemoJob("the benchmark sweep")
REPORT_JOB = "bench_report"
# One rank that runs out of memory must end its task at once: without this srun waits for the other
# ranks, which sit in NCCL collectives until NCCL's timeout or the task's time limit.
KILL_ON_BAD_EXIT = "--kill-on-bad-exit=1"
INPUTS = ("images", "latents")


@dataclass
class BenchmarkConfig:
    """The throughput sweep: one array per node count over the micro batch sizes (conf/benchmark/)."""

    micro_batch_sizes: list[int] = ruled(
        Each(Range(1), min_items=1),
        factory=lambda: [32, 64, 128],
        help="Micro batch sizes swept; one array task each per node count.",
    )
    nodes: list[int] = ruled(
        Each(Range(1), min_items=1), factory=lambda: [1], help="Node counts swept; one job array each."
    )
    inputs: list[str] = ruled(
        Each(Choice(INPUTS), min_items=1),
        factory=lambda: ["images"],
        help="What training reads: images (VAE + CLIP every step), latents (cached), or both side by side.",
    )
    max_steps: int = ruled(Range(1), 50, help="Optimizer steps per task.")
    warmup_steps: int = ruled(Range(0), 10, help="The first steps, left out of every number.")
    synthetic_data: bool | None = described(
        None,
        help="NeMo's synthetic data (no dataset, no loader cost); false reads the prepared data under data_dir; "
        "null: synthetic where NeMo has it for the trained family (SD), else the prepared data (SDXL).",
    )
    time_per_task: str = ruled(SlurmTime(), "00:30:00", help="Time limit of each sweep task.")
    array_throttle: int | None = ruled(
        Range(1), None, help="Tasks of one node count running at once; null = as many as Slurm allows."
    )
    memory_sample_s: float = ruled(
        Range(0, integer=False, above_lo=True),
        2.0,
        help="Seconds between nvidia-smi samples of GPU memory beside each task.",
    )
    report_resources: JobResources = field(
        default_factory=lambda: JobResources(cpus_per_task=1, mem="4G", time="00:10:00")
    )


def synthetic(cfg: Any) -> bool:
    """The sweep runs on NeMo's synthetic data: as set, else where the trained family has it."""
    chosen = cfg.benchmark.synthetic_data
    return family_of(cfg.training.model).synthetic_keys is not None if chosen is None else bool(chosen)


def job_name(nodes: int) -> str:
    return f"bench_n{nodes}"


def sweep(ctx: Context) -> Sweep:
    return _sweep(ctx.cfg)


def _sweep(cfg: Any) -> Sweep:
    b = cfg.benchmark
    gpus = max(cfg.cluster.gpus_per_node, 1)  # a cluster without GPUs runs one rank per node
    pairs = [(inputs, mbs) for inputs in dict.fromkeys(b.inputs) for mbs in b.micro_batch_sizes]
    cases = tuple(
        Case(
            job=job_name(nodes), task=i, nodes=nodes, gpus_per_node=gpus, micro_batch_size=mbs, inputs=inputs
        )
        for nodes in b.nodes
        for i, (inputs, mbs) in enumerate(pairs)
    )
    return Sweep(
        max_steps=b.max_steps,
        warmup_steps=b.warmup_steps,
        synthetic_data=synthetic(cfg),
        memory_sample_s=b.memory_sample_s,
        cases=cases,
    )


def _case_cfg(cfg: Any, case: Case) -> Any:
    """The run's config with the training section changed only where the sweep says."""
    b, tr = cfg.benchmark, cfg.training
    model: dict[str, Any] = {
        "micro_batch_size": case.micro_batch_size,
        "global_batch_size": case.global_batch_size,
    }
    reads_latents, keys = case.inputs == "latents", family_of(tr.model).synthetic_keys
    if synthetic(cfg) and keys is not None:
        # One epoch covers every step: an epoch boundary inside the measured steps would restart
        # the loader workers and be counted as training time.
        length = (b.max_steps + 1) * case.micro_batch_size
        model["data"] = {"synthetic_data": True, "synthetic_data_length": length}
        model.update(keys(reads_latents))
    merged = OmegaConf.to_container(OmegaConf.merge(OmegaConf.create(dict(tr.model)), model), resolve=True)
    # Real data: the latents switch decides what the case reads (latents.training_overrides).
    dp = cfg.data_preparation
    pre = dataclasses.replace(dp.precache, enable=reads_latents and not synthetic(cfg))
    changed = dataclasses.replace(
        tr,
        run=dataclasses.replace(tr.run, time_limit=b.time_per_task),
        trainer={**tr.trainer, "num_nodes": case.nodes, "max_steps": b.max_steps},
        model=merged,  # type: ignore[arg-type]
        # Speed does not depend on the starting weights, and only training plans init_from's init job.
        init_from=None,
    )
    return dataclasses.replace(cfg, training=changed, data_preparation=dataclasses.replace(dp, precache=pre))


def case_context(ctx: Context, case: Case) -> Context:
    return dataclasses.replace(ctx, cfg=_case_cfg(ctx.cfg, case))


def case_config(ctx: Context, case: Case) -> dict[str, Any]:
    """The NeMo config of one task: the training config builder's output, no checkpoints, own logs."""
    built = nemo_config.build(case_context(ctx, case))
    own = {
        "exp_manager": {
            "explicit_log_dir": str(task_dir(bench_dir(ctx.run_dir), case) / "nemo"),
            "create_checkpoint_callback": False,
            "resume_if_exists": False,
            # A task is minutes long and runs one rank per GPU under srun: no ft_launcher to heartbeat to.
            "create_fault_tolerance_callback": False,
        }
    }
    return OmegaConf.to_container(OmegaConf.merge(built, own), resolve=True)  # type: ignore[return-value]


def files(ctx: Context) -> tuple[tuple[Path, str], ...]:
    """cases.json and one NeMo config per case, written beside the scripts."""
    s, bench = sweep(ctx), bench_dir(ctx.run_dir)
    configs = tuple((config_path(bench, c), nemo_config.to_yaml(case_config(ctx, c))) for c in s.cases)
    return ((bench / "cases.json", s.to_json()), *configs)


def _resources(ctx: Context, case: Case) -> Resources:
    """What training gets on that many nodes, for the task's time; one rank per node without GPUs."""
    if ctx.cfg.cluster.gpus_per_node >= 1:
        return training_job.resources(case_context(ctx, case))
    cl = ctx.cfg.cluster
    return Resources(nodes=case.nodes, time=ctx.cfg.benchmark.time_per_task, partition=cl.partition)


def _sweep_job(ctx: Context, cases: list[Case]) -> JobSpec:
    b, run = ctx.cfg.benchmark, ctx.cfg.training.run
    python = nemo_python.interpreter(ctx.cfg, ctx.facts, SWEEP)
    argv = (
        python,
        "-u",
        "-m",
        "launcher.jobs.bench_task",
        "--bench-dir",
        str(bench_dir(ctx.run_dir)),
        "--job",
        cases[0].job,
        "--sample-s",
        str(b.memory_sample_s),
        "--",
        python,
        "-u",
        run.script,
    )
    # Tasks on one machine would measure each other: the local backend runs them one at a time.
    throttle = 1 if ctx.cfg.cluster.backend is BackendName.local else b.array_throttle
    job = make_job(
        ctx,
        stage=NAME,
        name=cases[0].job,
        argv=argv,
        resources=_resources(ctx, cases[0]),
        array=Array(len(cases), throttle),
        secret_files=training_job.secret_files_of(ctx),
        env=nemo_config.OFFLINE_HUB_ENV,
        with_code=False,
    )
    return dataclasses.replace(job, srun_args=(*job.srun_args, KILL_ON_BAD_EXIT))


def plan(ctx: Context) -> tuple[JobSpec, ...]:
    cases = sweep(ctx).cases
    names = dict.fromkeys(case.job for case in cases)  # one array per node count, in the given order
    sweeps = [_sweep_job(ctx, [case for case in cases if case.job == name]) for name in names]
    after_all = tuple(Dependency(job.name, DependencyKind.afterany) for job in sweeps)
    report = make_job(
        ctx,
        stage=NAME,
        name=REPORT_JOB,
        argv=ctx.module("launcher.jobs.bench_report", bench_dir(ctx.run_dir)),
        resources=cpu_resources(ctx, ctx.cfg.benchmark.report_resources),
        depends_on=after_all,
    )
    return (*sweeps, report)


def _notes(ctx: Context) -> tuple[str, ...]:
    s, b = sweep(ctx), ctx.cfg.benchmark
    return (
        (
            f"benchmark: {len(b.nodes)} node count(s) x {len(b.micro_batch_sizes)} micro batch size(s) = "
            f"{len(s.cases)} tasks of {s.max_steps} steps ({s.warmup_steps} warm-up steps excluded), "
            f"{'synthetic' if s.synthetic_data else 'real'} data; "
            f"report: {BenchmarkOutputs(ctx.run_dir).report_md}"
        ),
    )


def _needs(cfg: Any) -> tuple[str, ...]:
    """The staged models (the sweep builds the training model); the prepared data, and the data check
    that guards GPU time, only when it reads real data; the rehearsal of the training it measures."""
    data = () if synthetic(cfg) else ("data_preparation", "data_check")
    return ("assets", *data, "rehearsal")


def _check(cfg: Any, planned: frozenset[str]) -> None:
    """Rules between the sweep's fields (each field's own range is declared on it), and every case's
    NeMo config as training's checks see it."""
    b = cfg.benchmark
    for key, values in (("micro_batch_sizes", b.micro_batch_sizes), ("nodes", b.nodes), ("inputs", b.inputs)):
        if len(set(values)) != len(values):
            raise ConfigError(f"benchmark.{key}", f"{values} repeats a value; allowed: distinct integers")
    if b.warmup_steps >= b.max_steps:
        raise ConfigError(
            "benchmark.warmup_steps",
            f"{b.warmup_steps} leaves no step to measure; allowed: below benchmark.max_steps ({b.max_steps})",
        )
    family = family_of(cfg.training.model)
    if b.synthetic_data and family.synthetic_keys is None:
        raise ConfigError(
            "benchmark.synthetic_data",
            f"is true, but NeMo's {family.title} training has no synthetic data; allowed: false or null (the "
            "sweep reads the prepared data under data_dir, as training does)",
        )
    if "latents" in b.inputs and not synthetic(cfg) and not cfg.data_preparation.precache.enable:
        raise ConfigError(
            "benchmark.inputs",
            f"{b.inputs} with benchmark.synthetic_data=false reads the cached latents, but "
            "data_preparation.precache.enable is false (none are made); allowed: [images], synthetic data, "
            "or turn the switch on",
        )
    stop = cfg.training.run.stop_before_limit_s
    if (slurm_time_seconds(b.time_per_task) or 0) <= stop:
        # A task's NeMo stops itself stop_before_limit_s before the task's limit, as training does.
        raise ConfigError(
            "benchmark.time_per_task",
            f"{b.time_per_task} leaves no training time: NeMo stops training.run.stop_before_limit_s={stop} s "
            "before the limit; allowed: a longer time",
        )
    if cfg.cluster.backend is BackendName.local and b.nodes != [1]:
        raise ConfigError("benchmark.nodes", f"{b.nodes}: the local backend runs one node; allowed: [1]")
    for case in _sweep(cfg).cases:
        nemo_config.check(_case_cfg(cfg, case))


def _progress_lines(run_dir: Path) -> list[str]:
    """`status`'s sweep progress (the report job's module, imported only when a status asks)."""
    from launcher.bench.report import progress_lines

    return progress_lines(run_dir)


STAGE = StageSpec(
    name=NAME,
    config=BenchmarkConfig,
    plan=plan,
    needs=_needs,
    data_role=DataRole.reads,
    check=_check,
    nemo_jobs=lambda cfg: (SWEEP,),
    preflight=lambda cfg, planned: Findings(problems=training_preflight.nemo_files(cfg)),
    files=files,
    notes=_notes,
    status=_progress_lines,
)
