"""SD 1.x (NeMo's MegatronLatentDiffusion with CLIP ViT-L/14, `sd_train.py`): the 860M presets at 256
and 512 px (conf/training/stable_diffusion/860m_res_*_pretrain, v1_1, v1_2, v1_5)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from launcher.families import ldm
from launcher.families.family import TEXT_FILE, UNET_FILE, VAE_FILE, Diffusers, Family, Released

# NeMo's CLIP ViT-L/14 text encoders (encoders/modules.py): transformers' model, or Megatron's.
CLIP_EMBEDDERS = ("FrozenCLIPEmbedder", "FrozenMegatronCLIPEmbedder")


def _matches(model: Any) -> bool:
    """A latent-diffusion config (no SDXL conditioner) whose text encoder is NeMo's CLIP ViT-L/14 one."""
    target = str((model.get("cond_stage_config") or {}).get("_target_", ""))
    return not model.get("conditioner_config") and target.rsplit(".", 1)[-1] in CLIP_EMBEDDERS


# Stable Diffusion v1.5: Runway's release, kept on the Hub by the stable-diffusion-v1-5 mirror (with
# runwayml's history) since Runway took theirs down in 2024. NeMo's own diffusers mapping reads its UNet
# exactly (tests/test_unet_names.py); its text encoder (CLIP ViT-L/14) is read from the repo too. The commit
# and digests are as public pins and cache listings give them (docs/finetuning.md#released-models).
SD15 = Released(
    repo_id="stable-diffusion-v1-5/stable-diffusion-v1-5",
    revision="451f4fe16113bff5a5d2269ed5ad43b0592e9a14",
    title="Stable Diffusion v1.5",
    licence="CreativeML OpenRAIL-M",
    configs="sd15",
    resolution=512,
    sha256=MappingProxyType(
        {
            UNET_FILE: "19da7aaa4b880e59d56843f1fcb4dd9b599c28a1d9d9af7c1143057c8ffae9f1",
            VAE_FILE: "a2b5134f4dbc140d9c11f11cba3233099e00af40f262f136c691fb7d38d2194c",
            TEXT_FILE: "d008943c017f0092921106440254dbbe00b6a285f7883ec8ba160c3faad88334",
        }
    ),
)

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
    diffusers=Diffusers(
        pipeline=ldm.PIPELINE,
        released=(SD15,),
        matches=ldm.diffusers_unet(linear_projection=False),
        stages_unet=False,
        schedule=ldm.schedule,
        exported_text=ldm.EXPORTED_TEXT,
        text_module=ldm.text_module,
        text_encoders=(("cond_stage_config", "text_encoder", "tokenizer"),),
    ),
)
