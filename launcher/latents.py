"""Cached latents: the one switch (`data_preparation.precache.enable`) and everything it changes in
training, asked by nemo_config, preflight, the stages and the launch. Imports no stage module.

On (and the data real), training and data_check read the latent tars that data preparation's
encode_latents writes (launcher/stages/precache.py plans those jobs): `training_overrides` gives the keys
and paths the switch sets in NeMo's config, `training_wdinfo` the wdinfo training reads. Off, training
reads the image tars. For SDXL (data_prep.model_family.is_sdxl) what is cached is the text embeddings
only (NeMo's `precache_mode: text`, data_prep.text_cache): the latents stay computed at every step so
that the size/crop conditioning and the random crops stay as they are.

`check` refuses, before anything is submitted, every config the encode step or NeMo's precached loader
could not serve: latent keys with the switch off (or other keys with it on), no VAE, random
augmentations (one draw would be frozen into the cache), a resolution the tars cannot give, latents
whose shape does not fit the UNet; for SDXL, what NeMo's cached-text path cannot serve.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from data_prep import latent_format as fmt
from data_prep import text_cache
from data_prep.model_family import is_sdxl
from launcher.errors import ConfigError
from launcher.layout import DataLayout

SWITCH = "data_preparation.precache.enable"
AUG = "training.model.data.train.augmentations"
IMAGE_KEYS = ("images", "captions")  # the preset's keys: what training reads with the switch off
LATENT_KEYS = (fmt.FIRST_STAGE_KEY, fmt.COND_STAGE_KEY)  # what the switch sets (NeMo's precached loader)


def enabled(cfg: Any) -> bool:
    """Training reads latents: the switch is on and the data is real (synthetic data has no tars)."""
    synthetic = cfg.training.model.get("data", {}).get("synthetic_data")
    return bool(cfg.data_preparation.precache.enable) and not synthetic


def training_overrides(cfg: Any, layout: DataLayout) -> dict[str, Any]:
    """What the switch sets in NeMo's training config (nothing when off): SD reads cached latents through
    its latent keys; SDXL reads cached text embeddings (`precache_mode: text`) through a conditioner whose
    caption embedders read them (data_prep.text_cache)."""
    if not enabled(cfg):
        return {}
    model = cfg.training.model
    if is_sdxl(model):
        switch: dict[str, Any] = {
            "precache_mode": text_cache.PRECACHE_MODE,
            "conditioner_config": {"emb_models": text_cache.cached_conditioner(model)},
        }
    else:
        switch = {"first_stage_key": LATENT_KEYS[0], "cond_stage_key": LATENT_KEYS[1]}
    return {
        **switch,
        "data": {
            "train": {"dataset_path": [str(layout.latent_wdinfo)]},
            "webdataset": {"local_root_path": str(layout.latent_tar_dir)},
        },
    }


def training_wdinfo(cfg: Any) -> PurePosixPath:
    """The wdinfo training reads: the latent tars' with the switch on, else the image tars'."""
    layout = DataLayout(PurePosixPath(cfg.data_dir))
    return layout.latent_wdinfo if enabled(cfg) else layout.wdinfo


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


def _check_sdxl(cfg: Any) -> None:
    """SDXL caches the caption embedders' outputs only (NeMo's precache_mode text): the images, their
    augmentations and the size/crop conditioning stay as they are."""
    model = cfg.training.model  # precache_mode set by hand is refused with the preset (launcher.sdxl_config)
    if not enabled(cfg):
        return
    keys = text_cache.caption_keys(model)
    if not keys:
        raise ConfigError(
            "training.model.conditioner_config.emb_models",
            f"no embedder reads {text_cache.CAPTIONS!r}: there is no text to cache. Allowed: the preset's "
            f"conditioner, or {SWITCH}=false",
        )
    entries = model.get("conditioner_config", {}).get("emb_models")
    for index in keys:
        if entries[index].get("legacy_ucg_value") is not None:
            raise ConfigError(
                f"training.model.conditioner_config.emb_models.{index}.legacy_ucg_value",
                "replaces captions in the batch, which training from cached text embeddings does not "
                f"read. Allowed: null (ucg_rate drops the embedding instead), or {SWITCH}=false",
            )
    if (model.get("data", {}).get("train", {}) or {}).get("filterings"):
        raise ConfigError(
            "training.model.data.train.filterings",
            "NeMo's cached-text loader filters on a 'jpg' member its tars do not have (it reads 'png'). "
            f"Allowed with {SWITCH}=true: null",
        )


def check(cfg: Any) -> None:
    """Every refusal of the switch's settings (the keys are checked whether it is on or off)."""
    if is_sdxl(cfg.training.model):
        _check_sdxl(cfg)
        return
    _check_keys(cfg)
    if not enabled(cfg):
        return
    _check_vae(cfg.training.model)
    _check_unet(cfg, _check_resolution(cfg))
