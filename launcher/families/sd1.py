"""SD 1.x (NeMo's MegatronLatentDiffusion with CLIP ViT-L/14, `sd_train.py`): the 860M presets at 256
and 512 px (conf/training/stable_diffusion/860m_res_*_pretrain, v1_1, v1_2, v1_5)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from data_prep.latent_format import uses_open_clip
from launcher.families import ldm
from launcher.families.family import Family


def _matches(model: Any) -> bool:
    """A latent-diffusion config (no SDXL conditioner) whose text encoder is not OpenCLIP."""
    return not model.get("conditioner_config") and not uses_open_clip(model)


FAMILY = Family(
    name="sd1",
    title="SD 860M",
    matches=_matches,
    text_encoders=ldm.text_encoders,
    assets=("text_encoder", "vae"),
    vae_asset="vae",
    inference=ldm.INFERENCE,
    cache=ldm.CACHE,
    trained_size=ldm.trained_size,
    synthetic_keys=ldm.synthetic_keys,
    rehearsal=ldm.REHEARSAL,
    # NeMo-Framework-Launcher's README (b8dfd8c4): SD 860M at 256 px from images, bf16, img/s per GPU.
    published_rates=MappingProxyType({256: MappingProxyType({"H100": 242.0, "A100": 123.0})}),
)
