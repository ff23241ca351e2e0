"""assets: one CPU job stages the pretrained CLIP text encoder and VAE that training loads.

It runs first whenever data_check or training is planned, so that a wrong repo id, revision or
token fails in minutes instead of after hours of data preparation.
"""

from __future__ import annotations

from launcher.config import AssetConfig, RootConfig, Stage
from launcher.spec import JobSpec
from launcher.stages.common import Context, cpu_resources, make_job

STAGE = "assets"
JOB_NAME = "pretrained_assets"


def needed(cfg: RootConfig) -> bool:
    """The stages that read the assets (the sweep builds the training model) were chosen and the user did
    not turn the download off."""
    return cfg.assets.enable and bool({Stage.data_check, Stage.benchmark, Stage.training} & set(cfg.stages))


def by_name(cfg: RootConfig) -> dict[str, AssetConfig]:
    """Every asset under the name its config key has (and the job's log uses)."""
    return {"text_encoder": cfg.assets.text_encoder, "vae": cfg.assets.vae}


def _asset_args(name: str, asset: AssetConfig) -> tuple[str, ...]:
    return ("--asset", name, asset.repo_id, asset.revision, asset.local_dir, *asset.files)


def plan(ctx: Context) -> tuple[JobSpec, ...]:
    assets = ctx.cfg.assets
    args = [word for name, asset in by_name(ctx.cfg).items() for word in _asset_args(name, asset)]
    # The token reaches the job as HF_TOKEN, read from the file at run time (never written here).
    secrets = (("HF_TOKEN", assets.hf_token_file),) if assets.hf_token_file else ()
    job = make_job(
        ctx, stage=STAGE, name=JOB_NAME, argv=ctx.module("data_prep.download_assets", *args),
        resources=cpu_resources(ctx, assets.resources), secret_files=secrets,
    )  # fmt: skip
    return (job,)
