"""ControlNet on SD 1.5: NeMo's ControlLDM (controlnet/controlnet.py, trained by controlnet_train.py), an SD
1.x latent diffusion model with a control stage, so it refines sd1: its configs are those with a
`control_stage_config`. NeMo's controlnet dataset reads <key>.jpg, <key>.txt and a <key>.png hint per sample
and yields images, captions and hint (controlnet_dataset.py build_train_valid_datasets, NeMo v2.4.0).

Both the trained UNet and the control stage's copy of it start from SD 1.5's single-file checkpoint (an asset
of this family, sd15_ckpt): ControlNet.load_from_unet reads only a torch file of CompVis's names with
from_NeMo true (false loads nothing: controlnet.py L544-547)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import MappingProxyType
from typing import Any

from launcher.errors import ConfigError
from launcher.families import ldm
from launcher.families.family import (
    CACHE_SWITCH,
    Family,
    Inference,
    InferenceProgram,
    Loader,
    Rehearsal,
)

NAME = "controlnet"
TITLE = "ControlNet SD 1.5"
HINT_MEMBER = "png"  # transform_fn reads sample["png"]
CONTROL_KEY = "hint"  # tuple_to_dict yields it under this name whatever model.control_key says
CKPT_ASSET = "sd15_ckpt"
CKPT_FILE = "v1-5-pruned-emaonly.ckpt"


def matches(model: Any) -> bool:
    return bool(model.get("control_stage_config"))


def batch_keys(model: Any) -> tuple[str, ...]:
    """tuple_to_dict's keys, fixed in NeMo's code (not first_stage_key/cond_stage_key)."""
    return ("images", "captions", CONTROL_KEY)


LOADER = Loader(
    images="build_train_valid_datasets",
    cached="build_train_valid_precached_datasets",
    reads_cache=ldm.reads_cache,
    batch_keys=batch_keys,
    module="nemo.collections.multimodal.data.controlnet.controlnet_dataset",
    members=("jpg", "txt", HINT_MEMBER),
)


def check_cache(cfg: Any, enabled: bool) -> None:
    """ControlLDM.build_train_valid_test_datasets calls build_train_valid_precached_datasets for an
    `*encoded` first_stage_key without importing it (controlnet.py L26, L950: a NameError), and those
    cached tars would hold no hint: NeMo's ControlNet reads images and hints from the image tars."""
    if enabled:
        raise ConfigError(
            CACHE_SWITCH,
            "is true, but NeMo's ControlNet reads images and <key>.png hints from the image tars, not cached "
            "latents; allowed with a ControlNet preset: data_preparation.precache.enable=false",
        )
    ldm.check_cache(cfg, enabled)


CACHE = dataclasses.replace(ldm.CACHE, check=check_cache, loader=LOADER)


def check(cfg: Any) -> None:
    """What NeMo's ControlLDM needs of the config, refused before anything is submitted."""
    model = cfg.training.model
    if model.get("image_logger") is not None:
        raise ConfigError(
            "training.model.image_logger",
            "is set: controlnet_train.py's ImageLogger hands log_images a dict where it calls next() on it "
            "(`'dict' object is not an iterator` at batch 0); allowed: null",
        )
    if model.get("control_key") != CONTROL_KEY:
        raise ConfigError(
            "training.model.control_key",
            f"{model.get('control_key')!r}: NeMo's controlnet dataset yields the hint as {CONTROL_KEY!r}; "
            f"allowed: {CONTROL_KEY}",
        )
    # NeMo's from_config_dict takes the ControlNet's arguments under `params` (the preset's, as NVIDIA's:
    # maybe_update_config_version moves them beside `_target_`) or already beside it.
    stage = model.get("control_stage_config") or {}
    params, where = (
        (stage["params"], "control_stage_config.params")
        if stage.get("params")
        else (stage, "control_stage_config")
    )
    if params.get("hint_channels") != 3:
        raise ConfigError(
            f"training.model.{where}.hint_channels",
            f"{params.get('hint_channels')}: the hints are RGB images (<key>.png); allowed: 3",
        )
    if params.get("from_pretrained_unet") and not params.get("from_NeMo", True):
        raise ConfigError(
            f"training.model.{where}.from_NeMo",
            "is false: ControlNet.load_from_unet then loads nothing (the control stage stays random); "
            "allowed: true, with from_pretrained_unet a checkpoint of CompVis's names",
        )


# GFLOP per 256 px training image on NeMo's own modules (torch's FlopCounterMode, batch 1, the preset's
# sizes): SD's step from images (launcher/cost.py: UNet forward + backward, VAE encoder, text encoder) plus
# the control stage's forward + backward (3x its 62.7 GFLOP forward with a 256 px hint:
# benchmarks/bench_controlnet_flops.py).
STEP_GFLOP_256 = 537.7 + 272.7 + 13.1 + 3 * 62.7


def gflop(side: int, inputs: str) -> tuple[float, str]:
    total = STEP_GFLOP_256 * ((side / 256) ** 2 if side else 1.0)
    return total, f"{total:,.0f} GFLOP at {side or 256} px (SD's step + the control stage's)"


EXAMPLES = "/opt/NeMo/examples/multimodal/text_to_image/controlnet"
INFER_SCRIPT = f"{EXAMPLES}/controlnet_infer.py"
# NeMo's controlnet_infer.py (v2.4.0), fed one hint image per prompt (controlnet_hints.hint_images). The
# samples job samples the .nemo training saves at its end (exp_manager's save_nemo_on_train_end): it converts
# checkpoints as stable_diffusion only. No evaluation: NeMo has no generator of ControlNet FID images.
INFERENCE = Inference(
    samplers=("DDIM", "PLMS"),  # initialize_sampler's; NVIDIA's controlnet_infer.yaml picks DDIM
    infer_script=INFER_SCRIPT,
    generate_script=INFER_SCRIPT,  # not run: the evaluation is refused (no program.generate)
    program=InferenceProgram(
        name="controlnet_infer",
        config="launcher.plugins.controlnet.infer:infer_config",
        image_name="launcher.jobs.samples:image_named_by_prompt",
    ),
    converts_checkpoints=False,
    strided_samplers=("DDIM", "PLMS"),  # make_ddim_timesteps, as SD's
    program_inputs="launcher.plugins.controlnet.sample_hints:program_inputs",
)


FAMILY = Family(
    name=NAME,
    title=TITLE,
    matches=matches,
    refines="sd1",
    text_encoders=ldm.text_encoders,
    assets=("text_encoder", "vae", CKPT_ASSET),
    vae_asset="vae",
    asset_defaults=MappingProxyType(
        {
            # SD 1.5's EMA weights in the original single-file layout (model.diffusion_model.*), from the
            # same repo and commit sd1's release pins (launcher/families/sd1.py). Its sha256 as public
            # model listings give it: cc6cb27103417325ff94f52b7a5d2dde45a7515b25c255d8e396c90014281516;
            # the assets job checks it against the Hub's own listing at that commit.
            CKPT_ASSET: {
                "repo_id": "stable-diffusion-v1-5/stable-diffusion-v1-5",
                "revision": "451f4fe16113bff5a5d2269ed5ad43b0592e9a14",
                "files": [CKPT_FILE],
                "local_dir": "${assets.dir}/sd15-ckpt",
            }
        }
    ),
    inference=INFERENCE,
    cache=CACHE,
    trained_size=ldm.trained_size,
    check=check,
    rehearsal=Rehearsal(
        model_class="nemo.collections.multimodal.models.text_to_image.controlnet.controlnet:MegatronControlNet",
        sampler="launcher.plugins.controlnet.rehearsal:draw",
        sampler_patches=ldm.REHEARSAL.sampler_patches,  # NeMo's DDIMSampler's CUDA buffers, as for SD
        tiny="launcher.plugins.controlnet.rehearsal:tiny",
    ),
    gflop=gflop,
    gflop_source="FLOP count (torch FlopCounterMode on NeMo's UNet, VAE, CLIP and ControlNet)",
    conf=Path(__file__).resolve().parent / "conf",
)
