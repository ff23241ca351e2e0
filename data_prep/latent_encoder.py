"""NeMo's own frozen VAE and text encoder, built from the training config, and training's image pipeline.

Everything here is what MegatronLatentDiffusion does to an image batch before the UNet (NeMo v2.0.0):
- models: `LatentDiffusion.from_config_dict(first_stage_config / cond_stage_config)`, eval, frozen
  (ldm/ddpm.py instantiate_first_stage / instantiate_cond_stage), with the staged weights the config names;
- an image: webdataset.py `pil_loader` (PIL, RGB), then `construct_image_augmentations(
  data.train.augmentations)` (resize, crop, ToTensor, Normalize to [-1, 1]) as stable_diffusion_dataset.py's
  `transform_fn` applies it;
- a batch: `first_stage_model.encode(x)` is a DiagonalGaussianDistribution whose `.parameters` are the
  moments training would sample from (ddpm.py get_input / encode_first_stage), and
  `cond_stage_model.encode(captions)` the text embedding (get_learned_conditioning);
- on a GPU, under the same autocast training uses (MegatronLatentDiffusion.process_batch: bf16 for
  bf16-mixed) and channels_last when model.channels_last is set. On CPU: float32, no autocast.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

# The config keys whose values change what is encoded; anything else (UNet, optimizer) does not.
ENCODE_KEYS = (
    "first_stage_config",
    "cond_stage_config",
    "data.train.augmentations",
    "precision",
    "channels_last",
)
# trainer/model precision -> the autocast dtype MegatronLatentDiffusion picks.
_AUTOCAST = {"bf16": "bfloat16", "bf16-mixed": "bfloat16", "16": "float16", "16-mixed": "float16"}


def config_values(model: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    """{key: its value in the `model` section, as plain containers} (None where the config lacks it)."""
    selected = {key: OmegaConf.select(model, key) for key in keys}
    return {
        key: OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
        for key, value in selected.items()
    }


def frozen(module: Any) -> Any:
    module = module.eval()
    for param in module.parameters():
        param.requires_grad = False
    return module


def autocast(model: Any, device: Any) -> Any:
    """A context factory: on a GPU, the autocast MegatronLatentDiffusion / MegatronDiffusionEngine train
    under for the config's precision; on CPU (float32, no autocast) a null context."""
    import torch

    dtype = _AUTOCAST.get(str(model.get("precision", "32")))
    if device.type == "cuda" and dtype:
        return lambda: torch.autocast("cuda", getattr(torch, dtype))
    return contextlib.nullcontext


class LatentEncoder:
    """Encodes batches of (jpg bytes, caption) into (moments, text embedding) as float32 numpy arrays."""

    def __init__(self, model: DictConfig, device: str) -> None:
        import torch
        from nemo.collections.multimodal.data.common.webdataset import pil_loader
        from nemo.collections.multimodal.data.stable_diffusion.augmentation.augmentations import (
            construct_image_augmentations,
        )
        from nemo.collections.multimodal.models.text_to_image.stable_diffusion.ldm.ddpm import LatentDiffusion

        import data_prep.nemo_compat  # noqa: F401  (apex GroupNorm off NVIDIA's container; no-op inside)

        model = OmegaConf.create(OmegaConf.to_container(model, resolve=True))
        assert isinstance(model, DictConfig)
        self.device = torch.device(device)
        cond = model.cond_stage_config
        if "device" in cond:  # FrozenCLIPEmbedder moves its tokens there
            cond.device = device
        self.vae = frozen(LatentDiffusion.from_config_dict(model.first_stage_config)).to(self.device)
        self.text = frozen(LatentDiffusion.from_config_dict(cond)).to(self.device)
        if self.device.type == "cuda" and model.get("channels_last", False):
            self.vae = self.vae.to(memory_format=torch.channels_last)
        self.autocast = autocast(model, self.device)
        self.transform = construct_image_augmentations(model.data.train.get("augmentations"))
        self._load = pil_loader

    @staticmethod
    def depends_on(model: Any) -> dict[str, Any]:
        """The encode keys' values and the VAE file (its path, size and time)."""
        values = config_values(model, ENCODE_KEYS)
        vae = str(model.first_stage_config.get("from_pretrained") or "")
        stat = os.stat(vae) if vae and os.path.exists(vae) else None
        values["vae_file"] = [vae, stat.st_size if stat else None, int(stat.st_mtime) if stat else None]
        return values

    def preprocess(self, jpg: bytes) -> Any:
        """One image as the training loader yields it, channels first: [3, H, W] in [-1, 1]."""
        return self.transform(self._load("sample.jpg", jpg))

    def encode(self, images: list[Any], captions: list[str]) -> tuple[np.ndarray, np.ndarray]:
        import torch

        with torch.no_grad(), self.autocast():
            x = torch.stack(images).to(self.device, non_blocking=True)
            moments = self.vae.encode(x).parameters
            text = self.text.encode(list(captions))
        return moments.float().cpu().numpy(), text.float().cpu().numpy()

    def encode_members(self, images: list[Any], captions: list[str]) -> list[list[tuple[str, bytes]]]:
        """Each sample's tar members: one `pickle` (data_prep.latent_format)."""
        from data_prep.latent_format import MEMBER_EXT, dumps_sample

        moments, text = self.encode(images, captions)
        return [[(MEMBER_EXT, dumps_sample(m, t))] for m, t in zip(moments, text, strict=True)]
