"""Cached latents (`data_preparation.precache`): encode every image once, train from the stored latents.

One switch. On, data preparation gains two jobs after the image wdinfo: `encode_latents`, a Slurm array
on GPU nodes in the training container (one task per slice of tars, one process per GPU, NeMo's own
frozen VAE and text encoder built from the training config; data_prep.encode_latents), then
`latents_wdinfo`. Training and data_check then read the latent tars: `build` here gives the keys and
paths the switch sets in the NeMo config. Off, training reads the image tars as before.

`check` refuses, before anything is submitted, every config the encode step or NeMo's precached loader
could not serve: latent keys with the switch off (or other keys with it on), no VAE, random
augmentations (one draw would be frozen into the cache), a resolution the tars cannot give, latents
whose shape does not fit the UNet.
"""

from __future__ import annotations

import math
from typing import Any

from data_prep import latent_format as fmt
from launcher.config import BackendName, JobResources, Runtime
from launcher.errors import ConfigError
from launcher.layout import DataLayout
from launcher.sizing import encode_tasks, planned_rows
from launcher.spec import Array, JobSpec, Resources
from launcher.stages.common import Context, Facts, after, after_stage, cpu_resources, make_job

AUG = "training.model.data.train.augmentations"
IMAGE_KEYS = ("images", "captions")  # the preset's keys: what training reads with the switch off


def enabled(cfg: Any) -> bool:
    """Training reads latents: the switch is on and the data is real (synthetic data has no tars)."""
    synthetic = cfg.training.model.get("data", {}).get("synthetic_data")
    return bool(cfg.data_preparation.precache.enable) and not synthetic


def training_overrides(cfg: Any, layout: DataLayout) -> dict[str, Any]:
    """What the switch sets in NeMo's training config (nothing when off)."""
    if not enabled(cfg):
        return {}
    return {
        "first_stage_key": fmt.FIRST_STAGE_KEY,
        "cond_stage_key": fmt.COND_STAGE_KEY,
        "data": {
            "train": {"dataset_path": [str(layout.latent_wdinfo)]},
            "webdataset": {"local_root_path": str(layout.latent_tar_dir)},
        },
    }


# -- checks -----------------------------------------------------------------------------------------


def _check_keys(cfg: Any) -> None:
    model = cfg.training.model
    if model.get("data", {}).get("synthetic_data"):
        return  # no tars are read: NeMo's synthetic data yields either kind (SDSyntheticDataset)
    keys = {name: str(model.get(name, "")) for name in ("first_stage_key", "cond_stage_key")}
    latent = [name for name, value in keys.items() if fmt.is_latent_key(value)]
    if not cfg.data_preparation.precache.enable:
        if latent:
            raise ConfigError(
                f"training.model.{latent[0]}",
                f"{keys[latent[0]]!r} makes NeMo read cached latents (.pickle members), but "
                "data_preparation.precache.enable is false, so training reads the image tars. Allowed: "
                f"first_stage_key={IMAGE_KEYS[0]}, cond_stage_key={IMAGE_KEYS[1]}, or turn "
                "data_preparation.precache.enable=true (it sets both keys and the paths)",
            )
        return
    wanted = {
        "first_stage_key": (IMAGE_KEYS[0], fmt.FIRST_STAGE_KEY),
        "cond_stage_key": (IMAGE_KEYS[1], fmt.COND_STAGE_KEY),
    }
    for name, allowed in wanted.items():
        if keys[name] not in allowed:
            raise ConfigError(
                f"training.model.{name}",
                f"{keys[name]!r} with data_preparation.precache.enable=true: the switch sets it to "
                f"{allowed[1]!r} (NeMo's precached loader); allowed: {', '.join(allowed)}, or turn the "
                "switch off to train from images",
            )


def _check_vae(model: Any) -> None:
    if not (model.get("first_stage_config") or {}).get("from_pretrained"):
        raise ConfigError(
            "training.model.first_stage_config.from_pretrained",
            "is null: data_preparation.precache would store the latents of a random VAE. Allowed: the VAE "
            "file training loads (default ${assets.vae.local_dir}/diffusion_pytorch_model.safetensors)",
        )


def _check_resolution(cfg: Any) -> tuple[int, int]:
    augmentations = cfg.training.model.get("data", {}).get("train", {}).get("augmentations") or {}
    if augmentations.get("horizontal_flip") or "random_crop_h_w" in augmentations:
        raise ConfigError(
            f"{AUG}.horizontal_flip" if augmentations.get("horizontal_flip") else f"{AUG}.random_crop_h_w",
            "is random: data_preparation.precache would freeze one draw per image into the cache. Allowed "
            "with the switch on: resize_smallest_side, center_crop_h_w, horizontal_flip=false",
        )
    crop = fmt.crop_size(cfg.training.model)
    if crop is None:
        raise ConfigError(
            f"{AUG}.center_crop_h_w",
            f"{augmentations.get('center_crop_h_w')!r}: the encode "
            "step needs one fixed size; allowed: 'H, W', e.g. '256, 256'",
        )
    side = int(augmentations.get("resize_smallest_side") or min(crop))
    factor = fmt.downsampling(cfg.training.model)
    if min(crop) > side or any(n % factor for n in crop):
        raise ConfigError(
            f"{AUG}.center_crop_h_w",
            f"{crop} with resize_smallest_side {side} and a VAE "
            f"downsampling {factor}x: allowed: sides <= {side} and multiples of {factor}",
        )
    images = cfg.data_preparation.download_images
    if images.enable and images.resize_mode != "no" and side > images.image_size:
        raise ConfigError(
            f"{AUG}.resize_smallest_side",
            f"{side} but data_preparation.download_images.image_size is {images.image_size}: the tars cannot "
            f"give {side} px (each image would be upscaled before encoding). Allowed: at most "
            f"{images.image_size}, or raise download_images.image_size",
        )
    return crop


def _check_unet(cfg: Any, crop: tuple[int, int]) -> None:
    model = cfg.training.model
    unet, vae = model.get("unet_config", {}), model.get("first_stage_config", {})
    (channels, height, width), _ = fmt.sample_shapes(model)
    if int(vae.get("embed_dim", 4)) != int(unet.get("in_channels", 4)):
        raise ConfigError(
            "training.model.unet_config.in_channels",
            f"{unet.get('in_channels')} but the cached moments hold {channels} = 2 x "
            f"first_stage_config.embed_dim ({vae.get('embed_dim')}) channels; allowed: in_channels = embed_dim",
        )
    size = unet.get("image_size")
    if size is not None and (int(size), int(size)) != (height, width):
        raise ConfigError(
            "training.model.unet_config.image_size",
            f"{size} but the latents of a {crop[0]}x{crop[1]} crop ({AUG}.center_crop_h_w) are {height}x{width}; "
            f"allowed: {height} (crop / {fmt.downsampling(model)}), or change the crop",
        )


def check(cfg: Any) -> None:
    """Every refusal of the switch's settings (the keys are checked whether it is on or off)."""
    _check_keys(cfg)
    if not enabled(cfg):
        return
    _check_vae(cfg.training.model)
    _check_unet(cfg, _check_resolution(cfg))


def python(cfg: Any, facts: Facts) -> str | None:
    """The interpreter with NeMo that runs the encode step."""
    pre = cfg.data_preparation.precache
    if pre.python:
        return str(pre.python)
    if cfg.container.runtime is Runtime.pyxis:
        return cfg.training.run.python or cfg.container.python or "python3"
    if cfg.cluster.backend is BackendName.local:
        return facts.nemo_python  # this machine: its NeMo venv, or refused by host_check
    # A Slurm cluster without containers: this checkout's NeMo venv, else the interpreter training runs.
    return facts.nemo_python or cfg.training.run.python


def host_check(cfg: Any, facts: Facts) -> None:
    if enabled(cfg) and python(cfg, facts) is None:
        raise ConfigError(
            "data_preparation.precache.python",
            f"None and this checkout has no NeMo interpreter ({facts.code_dir}/.venv-nemo/bin/python) for the "
            "encode step without a container; allowed: a Python with NeMo (see requirements-nemo.txt)",
        )


# -- planning ----------------------------------------------------------------------------------------


def _encode_resources(ctx: Context) -> Resources:
    """A whole GPU node per array task, one process per GPU; on a cluster without GPUs, one CPU task."""
    cl, pre = ctx.cfg.cluster, ctx.cfg.data_preparation.precache
    if cl.gpus_per_node < 1:
        return cpu_resources(ctx, pre.resources)
    cpus = cl.cpus_per_node // cl.gpus_per_node if cl.cpus_per_node else pre.resources.cpus_per_task
    return Resources(
        nodes=1,
        ntasks_per_node=cl.gpus_per_node,
        cpus_per_task=max(cpus, 1),
        gpus_per_node=cl.gpus_per_node,
        mem=cl.gpu_job_mem,
        time=pre.resources.time,
        exclusive=cl.exclusive_gpu_jobs,
        partition=cl.partition,
    )


def plan(ctx: Context, config_path: Any, last_job: str | None, env: dict[str, str]) -> tuple[JobSpec, ...]:
    """encode_latents (array) then latents_wdinfo, after `last_job` (the image wdinfo); `env` is the
    offline-Hub environment NeMo jobs run with (launcher.nemo_config)."""
    pre, layout = ctx.cfg.data_preparation.precache, ctx.layout
    nemo_python = python(ctx.cfg, ctx.facts) or ctx.python  # None is refused by host_check before planning
    device = pre.device or ("cuda" if ctx.cfg.cluster.gpus_per_node >= 1 else "cpu")
    common = ("--input-wdinfo", layout.wdinfo, "--output-dir", layout.latent_tar_dir)
    encode = make_job(
        ctx,
        stage="data_preparation",
        name="encode_latents",
        argv=(
            nemo_python,
            "-m",
            "data_prep.encode_latents",
            "encode",
            "--training-config",
            str(config_path),
            "--input-dir",
            str(layout.tar_dir),
            *map(str, common),
            "--batch-size",
            str(pre.batch_size),
            "--device",
            device,
        ),
        resources=_encode_resources(ctx),
        array=Array(encode_tasks(ctx.cfg)),
        depends_on=(*after(*[last_job] if last_job else []), after_stage("assets")),
        env=env,
    )
    wdinfo = make_job(
        ctx,
        stage="data_preparation",
        name="latents_wdinfo",
        argv=ctx.module("data_prep.encode_latents", "wdinfo", *common, "--verify"),
        resources=cpu_resources(ctx, JobResources(cpus_per_task=1, mem="2G", time="00:30:00")),
        depends_on=after(encode.name),
    )
    return encode, wdinfo


def storage_note(cfg: Any) -> str:
    """Bytes per sample and for the planned rows, printed before anything runs."""
    moments, text = fmt.sample_shapes(cfg.training.model)
    per_sample = fmt.sample_bytes(moments, text)
    head = (
        f"precache: {per_sample:,} bytes per sample (float16 moments {'x'.join(map(str, moments))} + "
        f"text {'x'.join(map(str, text))}, tar header included)"
    )
    rows = planned_rows(cfg)
    if rows is None:
        per_million = per_sample * 1_000_000 / 1e12
        return f"{head}; {per_million:.2f} TB per million rows (rows unknown: set data_preparation.rows_estimate)"
    tars = math.ceil(rows / cfg.data_preparation.reorganize_tar.tar_chunk_size)
    total = rows * per_sample + tars * 10240  # at most one 10 KiB closing record per tar
    return f"{head}; at most {total / 1e9:,.1f} GB for {rows:,} rows in {tars:,} tars"
