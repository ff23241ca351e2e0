"""The export's names at the real sizes, on the meta device (nothing downloaded, no weights): prints one JSON
object per preset.

    <nemo python> tests/nemo_cpu/export_names_cpu.py PRESETS.json     # {preset: its NeMo `model` section}

For each preset, NeMo's own UNetModel and AutoencoderKL built from the config, their state dicts in the
original layout as the export writes them (launcher.jobs.export_nemo), converted by diffusers' own
convert_ldm_unet_checkpoint / convert_ldm_vae_checkpoint with the configs the export writes
(launcher.jobs.export_diffusers); against diffusers' UNet2DConditionModel and AutoencoderKL built from those
configs: the tensors no name reaches, the names no tensor has, the shapes that differ; and where the export's
UNet config differs from the family's released one (tests/test_export_nemo.py reads it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import data_prep.nemo_compat  # noqa: F401  (apex GroupNorm absent off NVIDIA's container)

# The released configs' keys that fix the UNet's tensors and what it computes.
UNET_KEYS = (
    "block_out_channels",
    "down_block_types",
    "up_block_types",
    "layers_per_block",
    "cross_attention_dim",
    "attention_head_dim",
    "use_linear_projection",
    "transformer_layers_per_block",
    "addition_embed_type",
    "addition_time_embed_dim",
    "projection_class_embeddings_input_dim",
    "class_embed_type",
    "in_channels",
    "out_channels",
)


def _meta_state(section, **changes):
    import torch
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    with torch.device("meta"):
        return instantiate(OmegaConf.create({**section, **changes})).state_dict()


def _compare(ours, model):
    """(missing in ours, unexpected in ours, shapes that differ) against the diffusers model's state dict."""
    theirs = model.state_dict()
    return {
        "missing": sorted(set(theirs) - set(ours))[:5],
        "unexpected": sorted(set(ours) - set(theirs))[:5],
        "shapes": [k for k in theirs if k in ours and tuple(theirs[k].shape) != tuple(ours[k].shape)][:5],
        "tensors": len(theirs),
    }


def _default(key):
    """diffusers' default of a UNet config key a released config leaves out."""
    import inspect

    from diffusers import UNet2DConditionModel

    return inspect.signature(UNet2DConditionModel.__init__).parameters[key].default


def check(model):
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from diffusers.loaders.single_file_utils import convert_ldm_unet_checkpoint, convert_ldm_vae_checkpoint

    from launcher.families import family_of
    from launcher.families.family import DIFFUSERS_CONFIGS
    from launcher.jobs import export_diffusers, export_nemo

    family = family_of(model)
    unet_state = _meta_state(model["unet_config"], from_pretrained=None, use_flash_attention=False)
    vae_state = _meta_state(model["first_stage_config"], from_pretrained=None)
    single = {export_nemo.ORIGINAL_UNET + export_nemo.nemo_to_original(k): v for k, v in unet_state.items()}
    single.update({export_nemo.ORIGINAL_VAE + k: v for k, v in vae_state.items()})
    unet_config = export_diffusers.unet_config(model, family, single)
    vae_config = export_diffusers.vae_config(model, family, single)
    released = json.loads(
        (DIFFUSERS_CONFIGS / family.diffusers.released[0].configs / "unet_config.json").read_text()
    )
    levels = len(unet_config["block_out_channels"])

    def normal(key, value):  # a per-level value given once stands for every level (diffusers broadcasts it)
        per_level = key in ("attention_head_dim", "transformer_layers_per_block") and isinstance(value, int)
        return [value] * levels if per_level else list(value) if isinstance(value, (list, tuple)) else value

    with torch.device("meta"):
        unet = UNet2DConditionModel.from_config({k: v for k, v in unet_config.items() if k != "_class_name"})
        vae = AutoencoderKL.from_config({k: v for k, v in vae_config.items() if k != "_class_name"})
    return {
        "unet": _compare(convert_ldm_unet_checkpoint(single, unet_config), unet),
        "vae": _compare(convert_ldm_vae_checkpoint(single, vae_config), vae),
        "unet_config_differs": [
            key
            for key in UNET_KEYS
            if normal(key, unet_config.get(key)) != normal(key, released.get(key, _default(key)))
        ],
    }


if __name__ == "__main__":
    presets = json.loads(Path(sys.argv[1]).read_text())
    print(json.dumps({name: check(model) for name, model in presets.items()}))
