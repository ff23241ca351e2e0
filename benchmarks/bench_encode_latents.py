"""What cached latents save, and where the encode step's time goes. Run with the NeMo venv:

    .venv-nemo/bin/python benchmarks/bench_encode_latents.py [--images 64] [--batch 16] [--side 256]

1. FLOPs per training image, counted by torch's FlopCounterMode on NeMo's own modules built at the
   860M preset's sizes (random weights: FLOPs do not depend on them): the frozen VAE encoder and the
   CLIP ViT-L/14 text encoder, which the images path runs every step, and the UNet's forward and
   backward, which both paths run. Their ratio is the FLOP-based expectation of images per GPU-second,
   latents vs images (an upper bound: it ignores the optimizer step and the loader).
2. The encode step itself (data_prep.encode_latents.encode_tar with NeMo's modules) on photo-like JPEG
   tars, timed per part: tar read, decode + training's augmentations, VAE, text encoder, pickling +
   writing. On a CPU this machine's VAE dominates; on a GPU node see the FLOP table (no GPU here).
"""

from __future__ import annotations

import argparse
import pickle
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks"), str(REPO / "tests")]
PRESET = REPO / "conf/training/stable_diffusion/860m_res_256_pretrain.yaml"


def preset_model(side: int) -> Any:
    """The preset's model section at `side` px, weights not loaded (FLOPs do not depend on them)."""
    from omegaconf import OmegaConf

    model = OmegaConf.load(PRESET).model
    model.first_stage_config.from_pretrained = None
    model.unet_config.use_flash_attention = False  # a CUDA kernel; same FLOPs as torch attention
    model.unet_config.image_size = side // 8
    model.data.train.augmentations = {"resize_smallest_side": side, "center_crop_h_w": f"{side}, {side}"}
    return model


def gflop(run: Any) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        run()
    return counter.get_total_flops() / 1e9


def flop_table(side: int) -> list[tuple[str, float]]:
    import torch
    from hydra.utils import instantiate
    from nemo_parts import clip_vit_l_text

    import data_prep.nemo_compat  # noqa: F401  (apex GroupNorm)

    model = preset_model(side)
    vae = instantiate(model.first_stage_config).eval()
    clip = clip_vit_l_text().eval()
    unet = instantiate(model.unet_config)
    image = torch.randn(1, 3, side, side)
    tokens = torch.zeros(1, 77, dtype=torch.long)
    latent, context = torch.randn(1, 4, side // 8, side // 8), torch.randn(1, 80, 768)

    def unet_step() -> None:
        unet(latent, torch.tensor([500]), context=context).float().pow(2).mean().backward()

    with torch.no_grad():
        vae_g = gflop(lambda: vae.encode(image))
        clip_g = gflop(lambda: clip(input_ids=tokens))
    return [
        ("VAE encoder forward (frozen)", vae_g),
        ("CLIP text encoder forward (frozen)", clip_g),
        ("UNet forward + backward", gflop(unet_step)),
    ]


class Timer:
    """Wraps a callable, adding its wall time to `seconds[name]`."""

    def __init__(self, seconds: dict[str, float], name: str, fn: Any) -> None:
        self.seconds, self.name, self.fn = seconds, name, fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.seconds[self.name] = self.seconds.get(self.name, 0.0) + time.perf_counter() - start


def encode_timing(root: Path, images: int, batch: int, side: int, tiny: bool) -> tuple[dict[str, float], int]:
    """Encode `images` photo-like JPEGs with the real encode path; seconds per part and samples."""
    from bench_data_check import build_set
    from nemo_cpu.tiny import VAE, write_assets

    import data_prep.encode_latents as enc
    from data_prep.latent_encoder import LatentEncoder

    wdinfo, _ = build_set(root, tars=1, per_tar=images, side=side)
    model = preset_model(side)
    write_assets(root / "models")
    model.cond_stage_config.version = str(root / "models/clip-vit-large-patch14")
    model.cond_stage_config.device = "cpu"
    if tiny:
        model.first_stage_config.ddconfig.update(
            {"ch": VAE["ch"], "ch_mult": VAE["ch_mult"], "num_res_blocks": VAE["num_res_blocks"]}
        )
    encoder = LatentEncoder(model, "cpu")
    seconds: dict[str, float] = {}
    encoder.preprocess = Timer(seconds, "decode + augmentations", encoder.preprocess)  # type: ignore[method-assign]
    encoder.vae.encode = Timer(seconds, "VAE encoder", encoder.vae.encode)
    encoder.text.encode = Timer(seconds, "text encoder", encoder.text.encode)
    enc.read_samples = Timer(seconds, "tar read", enc.read_samples)  # type: ignore[assignment]
    start = time.perf_counter()
    name = pickle.loads(wdinfo.read_bytes())["tar_files"][0]
    done, _ = enc.encode_tar(encoder, root / "shards" / name, root / "out" / name, batch)
    total = time.perf_counter() - start
    seconds["pickling + tar writing"] = total - sum(seconds.values())
    seconds["total"] = total
    return seconds, done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--side", type=int, default=256)
    parser.add_argument("--real-vae", action="store_true", help="time the preset's VAE (slow on CPU)")
    args = parser.parse_args()

    rows = flop_table(args.side)
    total = sum(g for _, g in rows)
    print(f"GFLOP per {args.side} px training image, counted on NeMo's modules at the 860M preset's sizes")
    print(f"{'part':<38} {'GFLOP':>8} {'share':>6}")
    for name, value in rows:
        print(f"{name:<38} {value:>8.1f} {value / total:>6.1%}")
    unet = rows[-1][1]
    print(f"{'images path (all three), baseline':<38} {total:>8.1f} {'1.00x':>6}")
    print(f"{'latents path (UNet only)':<38} {unet:>8.1f} {total / unet:>5.2f}x  <- expected img/s ratio")
    from launcher.cost import LATENTS_SPEEDUP  # the cost line's factor, from this table at 256 px

    print(f"launcher/cost.py's LATENTS_SPEEDUP (the training cost line): {LATENTS_SPEEDUP:.2f}x")

    with tempfile.TemporaryDirectory() as tmp:
        seconds, done = encode_timing(Path(tmp), args.images, args.batch, args.side, not args.real_vae)
    vae = "the preset's VAE" if args.real_vae else "tiny VAE (tests/nemo_cpu/tiny.py)"
    print(f"\nencode step on this CPU: {done} images at {args.side} px, batch {args.batch}, {vae}, tiny CLIP")
    print(f"{'part':<26} {'seconds':>8} {'share':>6}")
    for name, value in seconds.items():
        if name != "total":
            print(f"{name:<26} {value:>8.2f} {value / seconds['total']:>6.1%}")
    print(f"{'total':<26} {seconds['total']:>8.2f}  {done / seconds['total']:.1f} images/s")


if __name__ == "__main__":
    main()
