"""NeMo's MegatronLatentDiffusion (`sd_train.py`), which SD 1.x and SD 2.0 share: one text encoder in
`cond_stage_config`, sampled by sd_infer.py from a converted checkpoint, cached as VAE moments + text.

The parts both families are made of (launcher/families/sd1.py and sd2.py put them together); a family
of another NeMo model class has its own module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from data_prep import latent_format as fmt
from launcher.errors import ConfigError
from launcher.families.family import (
    PREDICTION_TYPES,
    Cache,
    ExportedText,
    Inference,
    InferenceProgram,
    Loader,
    Rehearsal,
    Schedule,
)

PIPELINE = "StableDiffusionPipeline"  # model_index.json's class of SD 1.x and 2.x releases

EXAMPLES = "/opt/NeMo/examples/multimodal/text_to_image/stable_diffusion"
AUG = "training.model.data.train.augmentations"
IMAGE_KEYS = ("images", "captions")  # the presets' keys: what training reads with the switch off
LATENT_KEYS = (fmt.FIRST_STAGE_KEY, fmt.COND_STAGE_KEY)  # what the switch sets (NeMo's precached loader)

INFERENCE = Inference(
    samplers=("PLMS", "DDIM", "DPM"),
    infer_script=f"{EXAMPLES}/sd_infer.py",
    generate_script=f"{EXAMPLES}/generate_fid_images.py",
    program=InferenceProgram(
        name="sd_infer",
        config="launcher.sampling.infer_config:infer_config",
        image_name="launcher.jobs.samples:image_named_by_prompt",
        generate="launcher.jobs.generate:generate_fid",
    ),
    converts_checkpoints=True,
    # make_ddim_timesteps (diffusionmodules/util.py) strides the training timesteps.
    strided_samplers=("PLMS", "DDIM"),
    batch_is_global=True,
)


def text_encoders(model: Any) -> list[tuple[str, Any]]:
    cond = model.get("cond_stage_config")
    return [("cond_stage_config", cond)] if cond else []


def trained_size(model: Any) -> tuple[int, int] | None:
    """The crop of `data.train.augmentations` (construct_image_augmentations, NeMo v2.0.0 augmentations.py:
    "H, W" handed to torchvision as (h, w)) fixes the size."""
    augmentations = ((model.get("data") or {}).get("train") or {}).get("augmentations") or {}
    for key in ("center_crop_h_w", "random_crop_h_w"):
        if augmentations.get(key):
            height, width = (int(part) for part in str(augmentations[key]).split(","))
            return height, width
    return None


def synthetic_keys(latents: bool) -> dict[str, Any]:
    """NeMo's synthetic dataset yields encoded tensors for encoded keys (SDSyntheticDataset)."""
    keys = LATENT_KEYS if latents else IMAGE_KEYS
    return {"first_stage_key": keys[0], "cond_stage_key": keys[1]}


def cache_overrides(model: Any) -> dict[str, Any]:
    return synthetic_keys(True)


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


def check_cache(cfg: Any, enabled: bool) -> None:
    """Latent keys with the switch off (or other keys with it on), checked either way; with it on, no
    VAE, random augmentations (one draw would be frozen into the cache), a resolution the tars cannot give,
    latents whose shape does not fit the UNet."""
    _check_keys(cfg)
    if not enabled:
        return
    _check_vae(cfg.training.model)
    _check_unet(cfg, _check_resolution(cfg))


def per_sample(model: Any) -> tuple[int, str]:
    moments, text = fmt.sample_shapes(model)
    shapes = f"float16 moments {'x'.join(map(str, moments))} + text {'x'.join(map(str, text))}"
    return fmt.sample_bytes(moments, text), f"{shapes}, tar header included"


def reads_cache(model: Any) -> bool:
    """NeMo's own choice (ddpm.py build_train_valid_test_datasets): a latent first_stage_key reads the
    .pickle members."""
    return fmt.is_latent_key(str(model.get("first_stage_key", "")))


def batch_keys(model: Any) -> tuple[str, str]:
    return model.get("first_stage_key"), model.get("cond_stage_key")


LOADER = Loader(
    images="build_train_valid_datasets",
    cached="build_train_valid_precached_datasets",
    reads_cache=reads_cache,
    batch_keys=batch_keys,
    model_keys=("first_stage_key", "cond_stage_key"),
)

# SD's cache: the VAE's moments and the text encoder's output per sample.
CACHE = Cache(
    encoder="data_prep.latent_encoder:LatentEncoder",
    overrides=cache_overrides,
    check=check_cache,
    per_sample=per_sample,
    loader=LOADER,
    batch_check="data_prep.latent_check:loader_errors",
)


# sd_train.py builds MegatronLatentDiffusion (ldm/ddpm.py); its UNet is model.model.diffusion_model (the
# DiffusionWrapper's), and the rehearsal samples it with NeMo's SD pipeline, whose samplers need a patch.
REHEARSAL = Rehearsal(
    model_class="nemo.collections.multimodal.models.text_to_image.stable_diffusion.ldm.ddpm:MegatronLatentDiffusion",
    sampler="launcher.jobs.rehearsal_sample:latent_diffusion",
    sampler_patches=("launcher.jobs.nemo_cpu:patch_sampler_for_cpu",),
)


def diffusers_unet(linear_projection: bool) -> Callable[[Mapping[str, Any]], bool]:
    """A diffusers UNet config of MegatronLatentDiffusion's UNet: no SDXL vector conditioning; SD 2.x's
    transformers project linearly, SD 1.x's with 1x1 convolutions."""

    def matches(config: Mapping[str, Any]) -> bool:
        return (
            config.get("addition_embed_type") is None
            and bool(config.get("use_linear_projection", False)) == linear_projection
        )

    return matches


def schedule(model: Any) -> Schedule:
    """DDPM.__init__ (ldm/ddpm.py) reads these keys of the model config into make_beta_schedule."""
    return Schedule(
        beta_start=float(model["linear_start"]),
        beta_end=float(model["linear_end"]),
        timesteps=int(model["timesteps"]),
        beta_schedule=str(model.get("beta_schedule", "linear")),
        prediction_type=PREDICTION_TYPES[model.get("parameterization", "eps")],
    )


# The one text encoder, LatentDiffusion's `cond_stage_model` (ddpm.py instantiate_cond_stage), under the
# name CompVis's checkpoints give it; StableDiffusionPipeline reads its last hidden state.
EXPORTED_TEXT = (
    ExportedText(original="cond_stage_model.", text_encoder="text_encoder", tokenizer="tokenizer"),
)


def text_module(key: str) -> str:
    return "cond_stage_model"
