"""Tiny diffusers repos, one per family, as a released model's repo on the Hub is laid out (for the offline fake
Hub, tests/hf_fake_hub.py), and the NeMo-side overrides that give the same UNet and VAE.

Each repo is written by diffusers' and transformers' own classes and `save_pretrained` (safetensors):
model_index.json, scheduler/, unet/, vae/, text_encoder/, tokenizer/ (SDXL: text_encoder_2/, tokenizer_2/).
Its configs are the released model's shipped ones (launcher/families/diffusers_configs/<BASE_RELEASE>) with the
sizes changed, so it keeps what NeMo's mapping depends on: 2 resnets a level, widths multiples of 32 (NeMo's
attention GroupNorm has 32 groups), the real block types per level (SD 1.x/2.x attention on every level but
the last, SDXL none on the first), current diffusers' VAE attention names (to_q/to_k/to_v/to_out.0). Every
tensor is its initial value plus noise from a generator seeded by (repo seed, tensor name), so that a tensor
dropped or put in another's place changes the outputs.

    <nemo python> tests/nemo_cpu/tiny_diffusers.py FOLDER SEED FAMILY...   # FOLDER/<family>/: one repo each

Importable without torch (the overrides and configs are plain data); writing a repo needs NeMo's venv, with
the checkout and tests/ on PYTHONPATH.
"""

from __future__ import annotations

import json
import sys
import zlib
from pathlib import Path
from typing import Any

from launcher.families.family import DIFFUSERS_CONFIGS
from nemo_cpu.tiny import (
    OPEN_CLIP_WIDTH,
    SD2_OVERRIDES,
    SDXL_OVERRIDES,
    TINY_OVERRIDES,
    VAE,
    WIDTH,
    clip_text_config,
    write_tokenizer,
)

FAMILIES = ("sd1", "sd2", "sdxl")
# The release each family's tiny repo copies its configs from (scheduler, every UNet and VAE setting but the
# sizes): SD 2.x's fine-tune starts from SD 2.1 (768 px, v-prediction).
BASE_RELEASE = {"sd1": "sd15", "sd2": "sd21", "sdxl": "sdxl_base"}
# The presets the overrides apply to (NeMo's side of the same UNet): SD 1.5's, SD 2.x's at 512 px, SDXL's at
# 1024 px (their UNets are the releases': tests/test_unet_names.py).
PRESETS = {
    "sd1": "stable_diffusion/860m_res_512_v1_5",
    "sd2": "stable_diffusion/860m_res_512_v2_0_base",
    "sdxl": "sdxl/sdxl_base_train_res_1024_stage_3",
}
# Latents of this side by default (the pipeline draws 8x as many pixels); the UNets take any size.
SAMPLE_SIZE = 8
TIME_EMBED = 256  # SDXL's size/crop embedding per number (addition_time_embed_dim; NeMo's outdim)
SDXL_POOLED = OPEN_CLIP_WIDTH  # text_encoder_2's projection: the pooled text in SDXL's vector
SDXL_CONTEXT = WIDTH + OPEN_CLIP_WIDTH  # both encoders' hidden states side by side
SDXL_ADM = SDXL_POOLED + 6 * TIME_EMBED  # [pooled | original size | crop | target], 2 numbers each

_UNET_SIZES = {
    "sd1": {
        "block_out_channels": [WIDTH, 2 * WIDTH],
        "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"],
        "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"],
        "attention_head_dim": 2,  # diffusers' legacy name: 2 heads a level
        "cross_attention_dim": WIDTH,  # the tiny CLIP's width
    },
    "sd2": {
        "block_out_channels": [64, 128],
        "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"],
        "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"],
        "attention_head_dim": [1, 2],  # heads a level: 64 channels a head, as SD 2.x's
        "cross_attention_dim": OPEN_CLIP_WIDTH,  # the tiny open_clip's width (SD 2.x's NeMo text encoder)
    },
    "sdxl": {
        "block_out_channels": [64, 128],
        "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D"],
        "up_block_types": ["CrossAttnUpBlock2D", "UpBlock2D"],
        "transformer_layers_per_block": [1, 2],
        "attention_head_dim": [1, 2],
        "cross_attention_dim": SDXL_CONTEXT,
        "addition_time_embed_dim": TIME_EMBED,
        "projection_class_embeddings_input_dim": SDXL_ADM,
    },
}

UNET = "training.model.unet_config"
# The UNet sizes of tests/nemo_cpu/tiny.py's lists, which these replace.
_TINY_UNET_SIZES = {
    f"{UNET}.{key}"
    for key in (
        "model_channels",
        "channel_mult",
        "attention_resolutions",
        "num_res_blocks",
        "num_heads",
        "context_dim",
        "transformer_depth",
        "adm_in_channels",
    )
}


def _other_than_unet_sizes(overrides: list[str]) -> list[str]:
    """tiny.py's overrides less its UNet's sizes and its preset choice (CPU, batch, VAE, encoders)."""
    return [
        o for o in overrides if o.split("=", 1)[0] not in _TINY_UNET_SIZES and not o.startswith("training=")
    ]


# Launcher overrides that make the family's preset's NeMo UNet and VAE those of its tiny repo (and put the
# rest on a CPU, as tests/nemo_cpu/tiny.py does); tests/test_tiny_diffusers_nemo.py checks that they agree.
FINETUNE_OVERRIDES = {
    "sd1": [
        *_other_than_unet_sizes(TINY_OVERRIDES),
        f"{UNET}.model_channels={WIDTH}",
        f"{UNET}.channel_mult=[1,2]",
        f"{UNET}.num_res_blocks=2",
        f"{UNET}.attention_resolutions=[1]",
        f"{UNET}.num_heads=2",
        f"{UNET}.context_dim={WIDTH}",
    ],
    "sd2": [
        *_other_than_unet_sizes([*TINY_OVERRIDES, *SD2_OVERRIDES]),
        f"{UNET}.model_channels=64",
        f"{UNET}.channel_mult=[1,2]",
        f"{UNET}.num_res_blocks=2",
        f"{UNET}.attention_resolutions=[1]",
        f"{UNET}.num_head_channels=64",
        f"{UNET}.num_heads=-1",
        f"{UNET}.use_linear_in_transformer=true",
        f"{UNET}.context_dim={OPEN_CLIP_WIDTH}",
    ],
    "sdxl": [
        *_other_than_unet_sizes(SDXL_OVERRIDES),
        f"{UNET}.model_channels=64",
        f"{UNET}.channel_mult=[1,2]",
        f"{UNET}.num_res_blocks=2",
        f"{UNET}.attention_resolutions=[2]",
        f"{UNET}.transformer_depth=[1,2]",
        f"{UNET}.context_dim={SDXL_CONTEXT}",
        f"{UNET}.adm_in_channels={SDXL_ADM}",
    ],
}


def _shipped(family: str, name: str) -> dict[str, Any]:
    return json.loads((DIFFUSERS_CONFIGS / BASE_RELEASE[family] / name).read_text())


def unet_config(family: str) -> dict[str, Any]:
    """The tiny repo's UNet2DConditionModel config: the release's with the sizes above."""
    return {**_shipped(family, "unet_config.json"), **_UNET_SIZES[family], "sample_size": SAMPLE_SIZE}


def vae_config(family: str) -> dict[str, Any]:
    """The tiny repo's AutoencoderKL config: tests/nemo_cpu/tiny.py's VAE (NeMo's ddconfig) in diffusers' terms."""
    levels = len(VAE["ch_mult"])
    return {
        **_shipped(family, "vae_config.json"),
        "block_out_channels": [VAE["ch"] * m for m in VAE["ch_mult"]],
        "down_block_types": ["DownEncoderBlock2D"] * levels,
        "up_block_types": ["UpDecoderBlock2D"] * levels,
        "layers_per_block": VAE["num_res_blocks"],
        "sample_size": 8 * SAMPLE_SIZE,
    }


def _text_configs(family: str) -> dict[str, tuple[str, dict[str, Any], dict[str, Any]]]:
    """{folder: (transformers class, config changes from tiny.py's CLIP, tokenizer options)} of its encoders."""
    # OpenCLIP-sized: the tiny open_clip's text tower (tests/nemo_cpu/tiny.py, ViT-S-32-alt: width 256, 4 heads,
    # 10 layers), with OpenCLIP's gelu, and its tokenizer padding with "!" as the released ones do. SD 2.x's
    # repo holds one layer less (its NeMo encoder reads the penultimate); SDXL's second encoder keeps them all
    # and projects the pooled text.
    width = OPEN_CLIP_WIDTH
    open_clip = {
        "hidden_size": width,
        "intermediate_size": 4 * width,
        "num_attention_heads": 4,
        "hidden_act": "gelu",
    }
    pad = {"pad_token": "!"}
    if family == "sd1":
        return {"text_encoder": ("CLIPTextModel", {}, {})}
    if family == "sd2":
        return {"text_encoder": ("CLIPTextModel", {**open_clip, "num_hidden_layers": 9}, pad)}
    projected = {**open_clip, "num_hidden_layers": 10, "projection_dim": SDXL_POOLED}
    return {
        "text_encoder": ("CLIPTextModel", {}, {}),
        "text_encoder_2": ("CLIPTextModelWithProjection", projected, pad),
    }


def seeded(model: Any, seed: int, std: float = 0.02) -> Any:
    """`model` with each floating tensor moved by noise from its own generator (seed, tensor name): no two
    tensors alike, the initial scale kept (so the outputs stay of order 1)."""
    import torch

    with torch.no_grad():
        for name, tensor in model.state_dict(keep_vars=True).items():
            if tensor.is_floating_point():
                generator = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
                tensor.add_(torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype) * std)
    return model


def write_repo(family: str, folder: Path, seed: int) -> None:
    """The family's tiny diffusers repo in `folder` (see the module's text), its weights from `seed`."""
    import diffusers
    import torch
    import transformers

    def built(make: Any, config: Any, offset: int) -> Any:
        torch.manual_seed(seed * 101 + offset)  # the initial values; the noise is per tensor
        return seeded(make(config).eval(), seed * 101 + offset)

    parts: dict[str, Any] = {
        "unet": built(diffusers.UNet2DConditionModel.from_config, unet_config(family), 1),
        "vae": built(diffusers.AutoencoderKL.from_config, vae_config(family), 2),
    }
    scheduler = _shipped(family, "scheduler_config.json")
    parts["scheduler"] = getattr(diffusers, scheduler["_class_name"]).from_config(scheduler)
    for offset, (text, (cls, changes, options)) in enumerate(_text_configs(family).items(), start=3):
        parts[text] = built(getattr(transformers, cls), clip_text_config(**changes), offset)
        tokenizer = text.replace("text_encoder", "tokenizer")
        parts[tokenizer] = write_tokenizer(folder / tokenizer, **options)
    if family == "sdxl":
        pipeline = diffusers.StableDiffusionXLPipeline(**parts)
    else:
        pipeline = diffusers.StableDiffusionPipeline(
            **parts, safety_checker=None, feature_extractor=None, requires_safety_checker=False
        )
    pipeline.save_pretrained(folder, safe_serialization=True)


if __name__ == "__main__":
    out, seed = Path(sys.argv[1]), int(sys.argv[2])
    for index, name in enumerate(sys.argv[3:]):
        write_repo(name, out / name, seed + index)
