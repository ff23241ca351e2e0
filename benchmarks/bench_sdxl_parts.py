"""What each part of an SDXL training step costs per image, and what caching each input would save.

    .venv-nemo/bin/python benchmarks/bench_sdxl_parts.py [--sides 256 512 1024] [--preset PATH]

FLOPs per training image, counted by torch's FlopCounterMode on NeMo's own modules built at full size
from the SDXL preset's model section, on the meta device (shapes only: no weights are allocated, so the
2.6B-parameter UNet and the 695M-parameter OpenCLIP ViT-bigG-14 text tower need no memory):
- the frozen VAE encoder forward (AutoencoderKLInferenceWrapper.encode: encoder + sampling);
- the frozen CLIP ViT-L/14 text tower (NeMo's FrozenCLIPEmbedder reads `hidden_states[11]`, but
  transformers runs all 12 layers to get there) on 77 tokens;
- the frozen OpenCLIP ViT-bigG-14 text tower as NeMo's FrozenOpenCLIPEmbedder2 runs it (all 32 layers, the
  final norm and the pooled projection) on 77 tokens;
- the UNet forward and backward on the latent, the [80, 2048] cross-attention context and the 2816-wide
  vector (NeMo's GeneralConditioner output).
The size/crop embedders (sinusoidal features, no matmul) count as zero. Counted, not timed: it leaves out
the optimizer step, the loader and the kernels' efficiency; a benchmark sweep on GPUs measures those.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]
PRESET = REPO / "conf/training/sdxl/sdxl_base_train_res_256_stage_1.yaml"
TOKENS = 77  # both towers tokenize to 77; NeMo pads the outputs to 80 after the towers ran
SIDES = (256, 512, 1024)
PARTS = ("VAE encoder forward", "CLIP ViT-L/14 text forward", "OpenCLIP ViT-bigG-14 text forward")
UNET = "UNet forward + backward"


def gflop(run: Callable[[], Any]) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        run()
    return counter.get_total_flops() / 1e9


def model_section(preset: Path) -> Any:
    """The preset's model section, without the files it names (FLOPs do not depend on weights)."""
    from omegaconf import OmegaConf

    model = OmegaConf.load(preset).model
    model.first_stage_config.from_pretrained = None
    model.unet_config.from_pretrained = None
    model.unet_config.use_flash_attention = False  # a CUDA kernel; the same FLOPs as torch attention
    return model


def embedder(model: Any, name: str) -> Any:
    """The conditioner entry whose embedder class is `name` (the preset's own arguments)."""
    for entry in model.conditioner_config.emb_models:
        if str(entry.emb_model._target_).rsplit(".", 1)[-1] == name:
            return entry.emb_model
    raise KeyError(f"model.conditioner_config has no {name}")


def build(model: Any) -> dict[str, Any]:
    """NeMo's modules on the meta device, built from the preset's arguments."""
    import open_clip
    import torch
    from hydra.utils import instantiate
    from nemo.collections.multimodal.modules.stable_diffusion.encoders.modules import FrozenOpenCLIPEmbedder2
    from nemo_parts import clip_vit_l_text

    import data_prep.nemo_compat  # noqa: F401  (apex GroupNorm off NVIDIA's container)

    create = open_clip.create_model_and_transforms

    def create_on_meta(arch: str, device: Any = None, pretrained: Any = None, **kwargs: Any) -> Any:
        # NeMo's FrozenOpenCLIPEmbedder2 builds on the CPU with downloaded weights: here on meta, random.
        return create(arch, device=torch.device("meta"), pretrained=None, **kwargs)

    big_g = embedder(model, "FrozenOpenCLIPEmbedder2")
    open_clip.create_model_and_transforms = create_on_meta
    try:
        with torch.device("meta"):
            open_clip_text = FrozenOpenCLIPEmbedder2(
                arch=big_g.arch,
                version=None,
                device="meta",
                layer=big_g.layer,
                always_return_pooled=big_g.always_return_pooled,
                legacy=big_g.legacy,
            )
            unet = instantiate(model.unet_config)
            vae = instantiate(model.first_stage_config)
            clip = clip_vit_l_text(TOKENS)
    finally:
        open_clip.create_model_and_transforms = create
    return {"unet": unet, "vae": vae.eval(), "clip": clip.eval(), "open_clip": open_clip_text.eval()}


def flop_table(model: Any, modules: dict[str, Any], side: int) -> dict[str, float]:
    """GFLOP per image at `side` px for every part."""
    import torch

    unet_cfg = model.unet_config
    latent = side // 2 ** (len(model.first_stage_config.ddconfig.ch_mult) - 1)
    context = int(unet_cfg.context_dim)
    meta = {"device": "meta"}
    image = torch.randn(1, 3, side, side, **meta)
    tokens = torch.zeros(1, TOKENS, dtype=torch.long, **meta)
    x = torch.randn(1, int(unet_cfg.in_channels), latent, latent, **meta)
    # NeMo's conditioner pads both towers' 77 tokens to 80 before concatenating them.
    ctx = torch.randn(1, (TOKENS + 7) // 8 * 8, context, **meta)
    vector = torch.randn(1, int(unet_cfg.adm_in_channels), **meta)
    unet = modules["unet"]

    def unet_step() -> None:
        unet(x, torch.tensor([500], **meta), context=ctx, y=vector).float().pow(2).mean().backward()

    def open_clip_text() -> None:
        out = modules["open_clip"].encode_with_transformer(tokens)
        modules["open_clip"].pool(out["last"], tokens)

    with torch.no_grad():
        rows = {
            PARTS[0]: gflop(lambda: modules["vae"].encode(image)),
            PARTS[1]: gflop(lambda: modules["clip"](input_ids=tokens, output_hidden_states=True)),
            PARTS[2]: gflop(open_clip_text),
        }
    rows[UNET] = gflop(unet_step)
    return rows


def speedups(rows: dict[str, float]) -> dict[str, float]:
    """Expected images per GPU-second relative to training from images, by FLOPs, for each cached form."""
    total = sum(rows.values())
    text = rows[PARTS[1]] + rows[PARTS[2]]
    return {
        "images (nothing cached)": 1.0,
        "text embeddings cached (NeMo precache_mode text)": total / (total - text),
        "latents + text cached (NeMo precache_mode both)": total / rows[UNET],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", type=Path, default=PRESET, help="an SDXL training preset (its model:)")
    parser.add_argument("--sides", type=int, nargs="+", default=list(SIDES))
    args = parser.parse_args()

    model = model_section(args.preset)
    modules = build(model)
    tables = {side: flop_table(model, modules, side) for side in args.sides}
    print(f"GFLOP per training image, NeMo's modules at full size ({args.preset.name}), FlopCounterMode")
    print(f"{'part':<36}" + "".join(f"{f'{side} px':>18}" for side in args.sides))
    for part in (*PARTS, UNET):
        cells = "".join(
            f"{tables[s][part]:>10.1f} {tables[s][part] / sum(tables[s].values()):>6.1%} " for s in args.sides
        )
        print(f"{part:<36}{cells}")
    print(
        f"{'all (training from images)':<36}"
        + "".join(f"{sum(tables[s].values()):>10.1f}{'':8}" for s in args.sides)
    )
    print("\nexpected images per GPU-second relative to images (FLOP ratio, not measured)")
    for name in speedups(tables[args.sides[0]]):
        print(f"{name:<52}" + "".join(f"{speedups(tables[s])[name]:>8.2f}x" for s in args.sides))


if __name__ == "__main__":
    main()
