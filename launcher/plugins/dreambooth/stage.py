"""dreambooth: the regularization images of prior preservation, drawn by the base model in one GPU job before
training (NeMo's own prepare_reg_data, launcher/plugins/dreambooth/regularization.py), into
dreambooth.regularization_dir, so that dreambooth.py finds enough there and draws none itself. Its section also
holds the DreamBooth data source the preset reads (instance folder and prompt), checked before anything is
submitted. Planned with the assets stage (which it extends: every stage that waits for the staged weights,
training among them, waits for it) whenever the trained config is DreamBooth's."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher import nemo_config, nemo_python
from launcher.config import Runtime
from launcher.context import Context
from launcher.errors import ConfigError
from launcher.families import family_of
from launcher.nemo_python import NemoJob
from launcher.plugins.dreambooth import instance
from launcher.plugins.dreambooth.family import NAME as FAMILY
from launcher.rules import FOLDER, Choice, Range, SlurmTime, Text, ruled
from launcher.spec import JobSpec
from launcher.stage import Findings, StageSpec
from launcher.stages.common import gpu_task_resources, make_job, require_mounted

NAME = "dreambooth"
JOB = NemoJob("dreambooth_regularization")
PROGRAM = "launcher.plugins.dreambooth.regularization"


@dataclass
class DreamBoothConfig:
    # Null here: conf/dreambooth.yaml's values where a DreamBooth preset brings that file into the
    # root config (its keys then need no `+`; the presets interpolate the data source's: ${dreambooth.<key>}).
    instance_dir: str | None = ruled(
        Text(),
        None,
        help="The subject's images (a flat folder of image files), read by NeMo's DreamBoothDataset.",
    )
    instance_prompt: str | None = ruled(
        Text(), None, help="The one prompt of every instance image (a rare token and its class)."
    )
    regularization_prompt: str | None = ruled(
        Text(), None, help="The class prompt the base model draws the regularization images from."
    )
    regularization_dir: str | None = ruled(
        FOLDER,
        None,
        help="Where the regularization images are written (model.data.num_reg_images) and read.",
    )
    sampler: str | None = ruled(Choice(("PLMS", "DDIM", "DPM")), None, help="NeMo's sampler for them.")
    inference_steps: int | None = ruled(Range(1, 1000), None, help="Sampling steps per image.")
    guidance_scale: float | None = ruled(
        Range(1, 30, integer=False), None, help="Classifier-free guidance scale."
    )
    time_limit: str | None = ruled(SlurmTime(), None, help="The regularization job's time limit.")


def is_dreambooth(cfg: Any) -> bool:
    return family_of(cfg.training.model).name == FAMILY


def config_path(ctx: Context) -> Path:
    """The config NeMo's prepare_reg_data reads: training's, with the `infer` section it samples with."""
    return ctx.run_dir / NAME / "regularization.yaml"


def _config(ctx: Context) -> dict[str, Any]:
    """dreambooth.yaml's `infer` section (v2.4.0), from this section and the preset's data keys; the base
    model built from the released weights training starts from (restore_from_path null: no .nemo)."""
    config = nemo_config.build(ctx)
    data, db = config["model"]["data"], ctx.cfg.dreambooth
    config["model"]["restore_from_path"] = None
    config["trainer"].update(devices=1, num_nodes=1)  # one process on one GPU (NeMo's Trainer, no DDP peers)
    config["infer"] = {
        "unconditional_guidance_scale": db.guidance_scale,
        "num_images_per_prompt": data["num_images_per_prompt"],
        # All of a prompt's images in one batch: prepare_reg_data names a call's images by their index in
        # a batch, so with pipeline()'s default batch of 1 each call's images overwrite one another.
        "batch_size": data["num_images_per_prompt"],
        "height": data["resolution"],
        "width": data["resolution"],
        "down_factor": 8,
        "inference_steps": db.inference_steps,
        "sampler_type": db.sampler,
        "eta": 0,
        "output_type": "pil",
        "save_to_file": False,
        "out_path": data["regularization_dir"],
        "prompts": data["regularization_prompt"],
    }
    return config


def _prior(cfg: Any) -> bool:
    return bool(cfg.training.model.get("with_prior_preservation"))


def plan(ctx: Context) -> tuple[JobSpec, ...]:
    if not _prior(ctx.cfg):
        return ()
    python = nemo_python.interpreter(ctx.cfg, ctx.facts, JOB)
    argv = (python, "-u", "-m", PROGRAM, str(config_path(ctx)), ctx.cfg.training.run.script)
    return (
        make_job(
            ctx,
            stage=NAME,
            name=JOB.name,
            argv=argv,
            resources=gpu_task_resources(ctx, 1, ctx.cfg.dreambooth.time_limit, None),  # one GPU, else CPU
            env=nemo_config.OFFLINE_HUB_ENV,
        ),
    )


def _files(ctx: Context) -> tuple[tuple[Path, str], ...]:
    return ((config_path(ctx), nemo_config.to_yaml(_config(ctx))),) if _prior(ctx.cfg) else ()


def _check(cfg: Any, planned: frozenset[str]) -> None:
    data = cfg.training.model.get("data") or {}
    if _prior(cfg) and int(data.get("num_reg_images") or 0) < 1:
        raise ConfigError(
            "training.model.data.num_reg_images",
            f"{data.get('num_reg_images')!r} with with_prior_preservation true: allowed: 1 or more",
        )
    instance.check_set(cfg.dreambooth.instance_dir)
    if cfg.container.runtime is Runtime.pyxis:  # the jobs see these folders at the same place
        for key in ("instance_dir", "regularization_dir"):
            value = getattr(cfg.dreambooth, key)
            if value:
                require_mounted(f"dreambooth.{key}", value, cfg.container.mounts)
    nemo_config.check(cfg)


def _preflight(cfg: Any, planned: frozenset[str]) -> Findings:
    """The instance folder on this host (a dry run off the cluster may not see it: a warning there)."""
    try:
        count = instance.check(cfg.dreambooth.instance_dir)
    except ConfigError as error:
        return Findings(problems=[str(error)])
    return Findings(notes=[f"dreambooth: {count} instance images in {cfg.dreambooth.instance_dir}"])


def _notes(ctx: Context) -> tuple[str, ...]:
    data = ctx.cfg.training.model["data"]
    found = f"{data['instance_dir']}: instance images, prompt {data['instance_prompt']!r}"
    if not _prior(ctx.cfg):
        return (f"dreambooth: {found}; no prior preservation",)
    return (
        f"dreambooth: {found}; {data['num_reg_images']} regularization images of "
        f"{data['regularization_prompt']!r} drawn by the base model into {data['regularization_dir']} before training",
    )


STAGE = StageSpec(
    name=NAME,
    config=DreamBoothConfig,
    plan=plan,
    needs=lambda cfg: ("assets",),
    auto=is_dreambooth,
    extends="assets",
    check=_check,
    preflight=_preflight,
    nemo_jobs=lambda cfg: (JOB,) if _prior(cfg) else (),
    files=_files,
    notes=_notes,
)
