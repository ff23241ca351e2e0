"""export: a training checkpoint as a diffusers pipeline folder and an original-layout single file (docs/export.md).

One CPU job (launcher/jobs/export.py, NeMo's interpreter) reads a training .ckpt of any family that has a
diffusers pipeline (Family.diffusers) and its hparams.yaml, writes `<run>/export/step_<N>/diffusers/` (what
DiffusionPipeline.from_pretrained loads offline) and `<run>/export/step_<N>/<run>-step_<N>.safetensors` (the
original layout ComfyUI and A1111 read), checks both against NeMo's own modules and renames them into place.
Chosen with training it waits for the last training part; alone it exports the run's newest finished
checkpoint (its EMA twin when training kept EMA weights), or `export.checkpoint`. Planned only when named.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher import checkpoints, nemo_config, nemo_python
from launcher.config import JobResources, Runtime
from launcher.context import Context, Facts
from launcher.errors import ConfigError
from launcher.export.settings import DTYPES, ExportSettings
from launcher.families import family_of
from launcher.families.family import DIFFUSERS_BETA_SCHEDULES
from launcher.nemo_python import NemoJob
from launcher.outputs import ExportOutputs, TrainingOutputs
from launcher.paths import relative_to_run
from launcher.rules import ABS_PATH, Choice, Text, described, ruled
from launcher.spec import JobSpec
from launcher.stage import StageSpec
from launcher.stages import sampled
from launcher.stages.common import cpu_resources, make_job, require_mounted

NAME = "export"
JOB = NemoJob(
    NAME, "export.python"
)  # NeMo's and diffusers' code on CPU: its interpreter (launcher.nemo_python)


@dataclass
class ExportConfig:
    """A training checkpoint as a diffusers pipeline and a single file (conf/export/default.yaml)."""

    checkpoint: str | None = ruled(
        ABS_PATH,
        None,
        help="A training .ckpt to export (…/results/checkpoints/*.ckpt, hparams.yaml two folders up); null = "
        "this run's newest finished checkpoint.",
    )
    ema: bool | None = described(
        None,
        help="Export NeMo's EMA weights (the checkpoint's -EMA.ckpt twin); null = when training keeps them "
        "(training.exp_manager.ema.enable).",
    )
    dtype: str = ruled(
        Choice(tuple(DTYPES)),
        "fp32",
        help="What the exported weights are saved in (the checks compute in fp32).",
    )
    python: str | None = ruled(
        Text(),
        None,
        help="Interpreter with NeMo and diffusers for this job alone; null = training.run.python, else the "
        "image's python3 in a container, else this checkout's .venv-nemo.",
    )
    resources: JobResources = field(
        default_factory=lambda: JobResources(cpus_per_task=4, mem="64G", time="01:00:00")
    )


def ema(cfg: Any) -> bool:
    """export.ema, else whether training keeps NeMo's EMA weights."""
    given = cfg.export.ema
    return bool((cfg.training.exp_manager.get("ema") or {}).get("enable")) if given is None else bool(given)


def settings(ctx: Context) -> ExportSettings:
    return ExportSettings(
        run_dir=str(ctx.run_dir),
        checkpoints_dir=str(TrainingOutputs(ctx.run_dir).checkpoints),
        checkpoint=ctx.cfg.export.checkpoint,
        ema=ema(ctx.cfg),
        dtype=ctx.cfg.export.dtype,
    )


def plan(ctx: Context) -> tuple[JobSpec, ...]:
    argv = (
        nemo_python.interpreter(ctx.cfg, ctx.facts, JOB),
        "-u",
        "-m",
        "launcher.jobs.export",
        str(ExportOutputs(ctx.run_dir).settings),
    )
    resources = cpu_resources(ctx, ctx.cfg.export.resources)
    job = make_job(
        ctx, stage=NAME, name=NAME, argv=argv, resources=resources, env=nemo_config.OFFLINE_HUB_ENV
    )
    return (job,)


def _files(ctx: Context) -> tuple[tuple[Path, str], ...]:
    return ((ExportOutputs(ctx.run_dir).settings, settings(ctx).to_json()),)


def _notes(ctx: Context) -> tuple[str, ...]:
    s, out = settings(ctx), ExportOutputs(ctx.run_dir)
    what = s.checkpoint or "the newest finished training checkpoint"
    return (
        f"export: {what}{' (EMA weights)' if s.ema else ''} in {s.dtype} as a diffusers pipeline "
        f"{out.folder('<N>').pipeline} and a single file {out.folder('<N>').single_file}, each checked "
        "against NeMo's modules",
    )


def exportable(model: Any, key: str, source: str = "") -> None:
    """A model the export can write: a family with a diffusers pipeline, a schedule diffusers has, its text
    encoders in the config (a LoRA run's too: merged, its adapters beside). `key` is named in a refusal,
    `source` says where the model config was read (a checkpoint's hparams.yaml)."""
    family = family_of(model)
    diffusers, where = family.diffusers, f"{source}: " if source else ""
    if diffusers is None or diffusers.schedule is None:
        raise ConfigError(
            key, f"{where}{family.title} has no diffusers pipeline; allowed: a model of another family"
        )
    try:
        schedule = diffusers.schedule(model)
    except (KeyError, ValueError) as error:
        raise ConfigError(key, f"{where}the noise schedule: {error}") from None
    if schedule.beta_schedule not in DIFFUSERS_BETA_SCHEDULES:
        raise ConfigError(
            key,
            f"{where}beta_schedule {schedule.beta_schedule!r}: no diffusers scheduler has its betas; allowed: "
            f"{', '.join(DIFFUSERS_BETA_SCHEDULES)}",
        )
    embedders = len(family.text_encoders(model))
    if embedders != len(diffusers.exported_text):
        raise ConfigError(
            key,
            f"{where}{embedders} caption embedder(s), where {diffusers.pipeline} has "
            f"{len(diffusers.exported_text)} text encoder(s): a model trained from cached text embeddings "
            "holds none; allowed: a model trained from captions",
        )


def _check(cfg: Any, planned: frozenset[str]) -> None:
    """With training planned, its model is the one exported; a given checkpoint must be seen inside the
    container."""
    if not cfg.export.checkpoint and "training" in planned:
        exportable(cfg.training.model, "training.model")
    if cfg.export.checkpoint and cfg.container.runtime is Runtime.pyxis:
        require_mounted("export.checkpoint", cfg.export.checkpoint, cfg.container.mounts)


def _host_check(cfg: Any, planned: frozenset[str], facts: Facts) -> None:
    """The checkpoint exists now (or comes from training planned with it), beside the config it was trained
    with, of a model the export can write."""
    if cfg.export.checkpoint:
        checkpoint = sampled.given_checkpoint(cfg, NAME)
    elif "training" in planned:
        return
    else:
        checkpoint = sampled.newest_checkpoint(cfg, NAME, ema(cfg))
    model = sampled.hparams_model(checkpoint, "export.checkpoint", "the export of")
    exportable(model, "export.checkpoint", str(checkpoints.hparams_of(checkpoint)))


def status_lines(run: Path) -> list[str]:
    """The newest export (highest step) and how many checkpoints were exported."""
    import json

    exported = ExportOutputs(run).exported()
    if not exported:
        return []
    newest = exported[-1]
    record = json.loads(newest.record.read_text())
    kind = f"{'EMA, ' if record.get('ema') else ''}{record.get('dtype')}"
    return [
        f"export: newest {relative_to_run(newest.pipeline, run)} and {newest.single_file.name} ({kind}; "
        f"{len(exported)} checkpoint(s) exported)"
    ]


STAGE = StageSpec(
    name=NAME,
    config=ExportConfig,
    plan=plan,
    needs=lambda cfg: ("training",),
    check=_check,
    host_check=_host_check,
    nemo_jobs=lambda cfg: (JOB,),
    files=_files,
    notes=_notes,
    status=status_lines,
    summary=status_lines,
)
