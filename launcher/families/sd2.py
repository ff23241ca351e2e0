"""SD 2.0 (NeMo's MegatronLatentDiffusion with OpenCLIP ViT-H-14, `sd_train.py`): the v2_0 presets
(conf/training/stable_diffusion/860m_res_256_v2_0_pretrain, 860m_res_512_v2_0_base). Its text encoder's
weights are the `open_clip` asset; the CLIP text encoder is staged too (the evaluation's CLIP score)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from data_prep.latent_format import uses_open_clip
from launcher.families import ldm
from launcher.families.family import Family


def _matches(model: Any) -> bool:
    return not model.get("conditioner_config") and uses_open_clip(model)


FAMILY = Family(
    name="sd2",
    title="SD 2.0",
    matches=_matches,
    text_encoders=ldm.text_encoders,
    assets=("text_encoder", "vae", "open_clip"),
    vae_asset="vae",
    inference=ldm.INFERENCE,
    cache=ldm.CACHE,
    trained_size=ldm.trained_size,
    synthetic_keys=ldm.synthetic_keys,
    rehearsal=ldm.REHEARSAL,
    # NeMo-Framework-Launcher's README (b8dfd8c4): SD 2.0 at 512 px from images, img/s per H100.
    published_rates=MappingProxyType({512: MappingProxyType({"H100": 64.0})}),
)
