"""Tiny stand-ins for the pretrained CLIP text encoder and SD VAE (and SD 2.0's and SDXL's other parts),
and the sizes that fit a CPU.

The assets are laid out exactly as the pretrained_assets job lays out the real ones
(`<assets.dir>/clip-vit-large-patch14/` from `save_pretrained`, and
`<assets.dir>/sd-vae-ft-mse/diffusion_pytorch_model.safetensors` with diffusers' key names), so
NeMo loads them through the same code paths: `FrozenCLIPEmbedder(version=<folder>)` and
`AutoencoderKL(from_pretrained=<file>)` with its diffusers -> NeMo key renaming.

    <nemo python> tests/nemo_cpu/tiny.py ASSETS_DIR [--open-clip] [--sdxl]    # writes the tiny assets

Importable without torch (the overrides are plain strings); building the assets needs NeMo's venv.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

WIDTH = 32  # GroupNorm(32 groups) needs channels divisible by 32
VAE = {"ch": WIDTH, "ch_mult": [1, 1, 1, 1], "num_res_blocks": 1}  # 4 levels: the real 8x downsampling

# Launcher overrides that change only sizes, the device and CUDA-only kernels; everything else is
# the preset as users get it. TINY_SIZES holds those of SD's and SDXL's presets alike.
TINY_SIZES = [
    "training.trainer.accelerator=cpu",
    "training.model.micro_batch_size=2",
    "training.model.global_batch_size=2",
    "training.model.data.num_workers=1",
    f"training.model.unet_config.model_channels={WIDTH}",
    "training.model.unet_config.channel_mult=[1,2]",
    # Attention at 16x16 latents only: at 32x32 (1,024 tokens) it took half of each sampling step's CPU.
    "training.model.unet_config.attention_resolutions=[2]",
    "training.model.unet_config.num_res_blocks=1",
    # flash-attn and torch.compile (inductor) are the CUDA kernels of the preset: off on CPU.
    "training.model.unet_config.use_flash_attention=false",
    "training.model.inductor=false",
    f"training.model.first_stage_config.ddconfig.ch={VAE['ch']}",
    f"training.model.first_stage_config.ddconfig.ch_mult={VAE['ch_mult']}".replace(" ", ""),
    f"training.model.first_stage_config.ddconfig.num_res_blocks={VAE['num_res_blocks']}",
]
TINY_OVERRIDES = [
    *TINY_SIZES,
    "training.model.unet_config.num_heads=2",
    f"training.model.unet_config.context_dim={WIDTH}",
    "training.model.cond_stage_config.device=cpu",
]

# SD 2.0's text encoder at CPU size: NeMo's FrozenOpenCLIPEmbedder builds this built-in open_clip arch
# (43M parameters, text width 256, 77 tokens) from a file where the assets job stages ViT-H-14's weights.
OPEN_CLIP_ARCH = "ViT-S-32-alt"
OPEN_CLIP_WIDTH = 256
OPEN_CLIP_FILE = "CLIP-ViT-H-14-laion2B-s32B-b79K/open_clip_pytorch_model.bin"
SD2_OVERRIDES = [
    "training=stable_diffusion/860m_res_256_v2_0_pretrain",
    "training.model.unet_config.model_channels=64",  # num_head_channels 64: one head needs 64 channels
    "training.model.unet_config.num_heads=-1",  # the preset's: heads follow num_head_channels
    f"training.model.unet_config.context_dim={OPEN_CLIP_WIDTH}",
    f"training.model.cond_stage_config.arch={OPEN_CLIP_ARCH}",
]
# SDXL (the sdxl/ presets) at CPU size: the tiny CLIP and the same tiny open_clip arch as SD 2.0's, staged
# where the assets job stages OpenCLIP ViT-bigG-14 (a link to SD 2.0's file: the same weights, no second
# copy), and a tiny VAE where it stages SDXL's. The conditioner's widths follow: cross-attention CLIP +
# OpenCLIP, vector pooled OpenCLIP + 3 size/crop embedders x 2 x 256. FSDP needs a GPU: off.
OPEN_CLIP_BIGG_FILE = "CLIP-ViT-bigG-14-laion2B-39B-b160k/open_clip_pytorch_model.bin"
SDXL_VAE_FILE = "sdxl-vae/diffusion_pytorch_model.safetensors"
SDXL_CONDITIONER = "training.model.conditioner_config.emb_models"
SDXL_OVERRIDES = [
    *TINY_SIZES,
    "training.model.unet_config.model_channels=64",  # num_head_channels 64: one head needs 64 channels
    "training.model.unet_config.attention_resolutions=[1,2]",
    "training.model.unet_config.transformer_depth=[1,2]",  # a list per level, as the preset's [1, 2, 10]
    f"training.model.unet_config.context_dim={WIDTH + OPEN_CLIP_WIDTH}",
    f"training.model.unet_config.adm_in_channels={OPEN_CLIP_WIDTH + 3 * 2 * 256}",
    f"{SDXL_CONDITIONER}.0.emb_model.device=cpu",
    f"{SDXL_CONDITIONER}.1.emb_model.device=cpu",
    f"{SDXL_CONDITIONER}.1.emb_model.arch={OPEN_CLIP_ARCH}",
    "training.model.fsdp=false",
    "training.model.data.train.augmentations.resize_smallest_side=64",
]
CLIP_DIR = "clip-vit-large-patch14"
VAE_FILE = "sd-vae-ft-mse/diffusion_pytorch_model.safetensors"
_SPECIAL = ("<|startoftext|>", "<|endoftext|>")


def _byte_vocab() -> dict[str, int]:
    """CLIP's byte-level alphabet (each byte alone and as a word end) plus its two special tokens."""
    from transformers.models.clip.tokenization_clip import bytes_to_unicode

    chars = list(bytes_to_unicode().values())
    tokens = chars + [c + "</w>" for c in chars] + list(_SPECIAL)
    return {token: index for index, token in enumerate(tokens)}


def write_tokenizer(folder: Path, **options: Any) -> Any:
    """CLIP's tokenizer on the byte alphabet (no merges), its files in `folder`; returns it (`options`:
    CLIPTokenizer's, e.g. its pad token)."""
    from transformers import CLIPTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps(_byte_vocab()))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    return CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"), **options)


def clip_text_config(**changes: Any) -> Any:
    """The tiny CLIP text encoder's config: 12 layers (SDXL reads hidden layer 11), width WIDTH."""
    from transformers import CLIPTextConfig

    vocab = _byte_vocab()
    shape = {
        "hidden_size": WIDTH,
        "intermediate_size": 2 * WIDTH,
        "num_hidden_layers": 12,
        "num_attention_heads": 2,
    }
    return CLIPTextConfig(
        vocab_size=len(vocab),
        max_position_embeddings=77,
        bos_token_id=vocab[_SPECIAL[0]],
        eos_token_id=vocab[_SPECIAL[1]],
        **{**shape, **changes},
    )


def write_clip(folder: Path) -> None:
    """A 12-layer CLIP text encoder (SDXL reads hidden layer 11) and its tokenizer, saved like
    `openai/clip-vit-large-patch14`."""
    import torch
    from transformers import CLIPTextModel

    tokenizer = write_tokenizer(folder)
    torch.manual_seed(0)
    CLIPTextModel(clip_text_config()).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


# NeMo (LDM) VAE key -> diffusers key: the inverse of what AutoencoderKL._state_key_mapping undoes.
_PLAIN = [
    ("mid.attn_1.norm", "mid_block.attentions.0.group_norm"),
    ("mid.attn_1.q", "mid_block.attentions.0.query"),
    ("mid.attn_1.k", "mid_block.attentions.0.key"),
    ("mid.attn_1.v", "mid_block.attentions.0.value"),
    ("mid.attn_1.proj_out", "mid_block.attentions.0.proj_attn"),
    ("nin_shortcut", "conv_shortcut"),
    ("norm_out", "conv_norm_out"),
    (".upsample.", ".upsamplers.0."),
    (".downsample.", ".downsamplers.0."),
    (".block.", ".resnets."),
]


def diffusers_key(key: str, levels: int) -> str:
    key = re.sub(r"mid\.block_([12])", lambda m: f"mid_block.resnets.{int(m.group(1)) - 1}", key)
    key = re.sub(r"^decoder\.up\.(\d+)", lambda m: f"decoder.up_blocks.{levels - 1 - int(m.group(1))}", key)
    key = re.sub(r"^encoder\.down\.(\d+)", r"encoder.down_blocks.\1", key)
    for nemo_name, diffusers_name in _PLAIN:
        key = key.replace(nemo_name, diffusers_name)
    return key


def write_vae(path: Path) -> None:
    """NeMo's own AutoencoderKL at tiny width, saved under diffusers' key names as safetensors."""
    import torch
    from nemo.collections.multimodal.models.text_to_image.stable_diffusion.ldm.autoencoder import (
        AutoencoderKL,
    )
    from safetensors.torch import save_file

    torch.manual_seed(0)
    ddconfig = {
        "double_z": True,
        "z_channels": 4,
        "resolution": 256,
        "in_channels": 3,
        "out_ch": 3,
        "attn_resolutions": [],
        "dropout": 0.0,
        **VAE,
    }
    state = AutoencoderKL(ddconfig=ddconfig, embed_dim=4).state_dict()
    levels = len(VAE["ch_mult"])
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({diffusers_key(k, levels): v.contiguous() for k, v in state.items()}, str(path))


def write_open_clip(path: Path) -> None:
    """A whole open_clip model (text and image tower) with random weights, saved as open_clip's
    `open_clip_pytorch_model.bin` is (a plain state dict read with torch.load, loaded strictly)."""
    import open_clip
    import torch

    torch.manual_seed(0)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(open_clip.create_model(OPEN_CLIP_ARCH).state_dict(), path)


def write_assets(assets_dir: Path, open_clip: bool = False, sdxl: bool = False) -> None:
    write_clip(assets_dir / CLIP_DIR)
    write_vae(assets_dir / VAE_FILE)
    if open_clip or sdxl:
        write_open_clip(assets_dir / OPEN_CLIP_FILE)
    if sdxl:
        link = assets_dir / OPEN_CLIP_BIGG_FILE
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(assets_dir / OPEN_CLIP_FILE, link.parent))
        write_vae(assets_dir / SDXL_VAE_FILE)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import data_prep.nemo_compat  # noqa: F401  (NeMo's SD modules need a GroupNorm without apex)

    write_assets(Path(sys.argv[1]), open_clip="--open-clip" in sys.argv[2:], sdxl="--sdxl" in sys.argv[2:])
