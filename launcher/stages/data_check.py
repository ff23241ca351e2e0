"""data_check: NeMo's own SD loader reads the prepared data on CPU before training starts."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher import nemo_config, nemo_python, weights
from launcher.config import JobResources
from launcher.context import Context
from launcher.nemo_python import NemoJob
from launcher.outputs import DataCheckOutputs
from launcher.rules import Range, Text, described, ruled
from launcher.spec import JobSpec
from launcher.stage import DataRole, StageSpec
from launcher.stages.common import cpu_resources, make_job

NAME = "data_check"
# NeMo's loader and models: its interpreter (launcher.nemo_python)
JOB = NemoJob(NAME, "data_check.python", off=f"{NAME}.enable=false", off_means="no check of the data")


@dataclass
class DataCheckConfig:
    enable: bool = described(
        True, help="Read the prepared data with NeMo's own loader on CPU before any GPU time."
    )
    python: str | None = ruled(
        Text(),
        None,
        help=(
            "Interpreter with NeMo for this job alone; null = training.run.python, else the image's python3 in "
            "a container, else this checkout's .venv-nemo (refused when there is neither)."
        ),
    )
    batches: int = ruled(Range(1), 4, help="Batches NeMo's loader must yield.")
    model_check: bool = described(
        True, help="Also build NeMo's UNet, VAE (staged weights, every key) and text encoder on CPU."
    )
    num_workers: int = ruled(
        Range(1), 1, help="Loader workers (NeMo's loader uses persistent workers: 0 is refused there)."
    )
    micro_batch_size: int = ruled(Range(1), 4, help="Samples per batch read by the check.")
    resources: JobResources = field(
        default_factory=lambda: JobResources(cpus_per_task=4, mem="16G", time="00:30:00")
    )


def plan(ctx: Context) -> tuple[JobSpec, ...]:
    dc = ctx.cfg.data_check
    argv = (
        nemo_python.interpreter(ctx.cfg, ctx.facts, JOB),
        "-m",
        "data_prep.data_check",
        "--training-config",
        str(nemo_config.config_path(ctx)),
        "--world-size",
        str(nemo_config.world_size(ctx.cfg)),
        "--batches",
        str(dc.batches),
        "--num-workers",
        str(dc.num_workers),
        "--micro-batch-size",
        str(dc.micro_batch_size),
        "--report",
        str(DataCheckOutputs(ctx.run_dir).report),
        *(("--model-check",) if dc.model_check else ()),
        *_release_args(ctx.cfg),
    )
    resources = cpu_resources(ctx, dc.resources)
    found = weights.of(ctx.cfg) if dc.model_check else None
    if found is not None and _megabytes(found.diffusers.check_mem) > _megabytes(resources.mem):
        resources = dataclasses.replace(resources, mem=found.diffusers.check_mem)
    job = make_job(
        ctx, stage=NAME, name="data_check", argv=argv, resources=resources, env=nemo_config.OFFLINE_HUB_ENV
    )
    return (job,)


def _megabytes(mem: str | None) -> int:
    """A Slurm memory size in MB ("0", all of a node's, counts as the most)."""
    if mem is None:
        return 0
    if mem == "0":
        return 1 << 62
    units = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
    return int(float(mem.rstrip("KMGT")) * units.get(mem[-1], 1))


def _release_args(cfg: Any) -> tuple[str, ...]:
    """With the model check, training.weights' diffusers folder: the UNet is loaded from it and compared."""
    found = weights.of(cfg)
    if found is None or not cfg.data_check.model_check:
        return ()
    return ("--release", str(weights.origin_dir(cfg, found)))


def _needs(cfg: Any) -> tuple[str, ...]:
    """The data it reads; the staged models only when it builds them (the model check)."""
    return ("data_preparation", "assets") if cfg.data_check.model_check else ("data_preparation",)


def _check(cfg: Any, planned: frozenset[str]) -> None:
    nemo_config.check(cfg)


def summary_lines(run_dir: Path) -> list[str]:
    """What the data check found, once it wrote its report (the local backend's summary prints it)."""
    path = DataCheckOutputs(run_dir).report
    if not path.exists():
        return []
    found = json.loads(path.read_text())
    loader = found.get("loader") or {}
    return [
        f"data_check: {'passed' if found['ok'] else 'FAILED'}: {found['wdinfo']['total_key_count']:,} samples, "
        f"batch images {loader.get('images')}, {loader.get('images_per_s')} images/s on this CPU ({path})"
    ]


STAGE = StageSpec(
    name=NAME,
    config=DataCheckConfig,
    plan=plan,
    needs=_needs,
    auto=lambda cfg: cfg.data_check.enable,
    data_role=DataRole.reads,
    check=_check,
    nemo_jobs=lambda cfg: (JOB,),
    files=nemo_config.config_files,
    summary=summary_lines,
)
