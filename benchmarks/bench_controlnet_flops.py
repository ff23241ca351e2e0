"""The FLOPs of ControlNet's control stage, which the ControlNet family's cost line adds to SD's step
(launcher/plugins/controlnet/family.py STEP_GFLOP_256). Run with the NeMo venv:

    .venv-nemo/bin/python benchmarks/bench_controlnet_flops.py

Counted by torch's FlopCounterMode on NeMo's own ControlNet and UNetModel built at the preset's sizes
(training=controlnet/sd15_512's control_stage_config and unet_config; random weights: FLOPs do not depend
on them), batch 1, forward, at 256 px (32x32 latents, a 256 px hint, 77 tokens). The UNet's is printed
beside it: 3x it is launcher/cost.py's UNET_GFLOP (forward + backward).
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> None:
    import torch
    from omegaconf import OmegaConf
    from torch.utils.flop_counter import FlopCounterMode

    from launcher.jobs.nemo_cpu import patch_for_cpu

    patch_for_cpu()  # the UNet's GroupNorm comes from apex otherwise
    from nemo.collections.multimodal.models.text_to_image.controlnet.controlnet import ControlNet
    from nemo.collections.multimodal.modules.stable_diffusion.diffusionmodules.openaimodel import UNetModel

    preset = REPO / "launcher/plugins/controlnet/conf/training/controlnet/sd15_512.yaml"
    params = OmegaConf.load(preset).model.control_stage_config.params
    params = {key: params[key] for key in params if key != "from_pretrained_unet"}  # its path needs `assets`
    control = ControlNet(**params).eval()
    unet_keys = ("image_size", "in_channels", "model_channels", "attention_resolutions", "num_res_blocks")
    unet_keys += ("channel_mult", "num_heads", "use_spatial_transformer", "transformer_depth", "context_dim")
    unet = UNetModel(out_channels=4, use_flash_attention=False, **{k: params[k] for k in unet_keys}).eval()
    x, t = torch.randn(1, 4, 32, 32), torch.tensor([500])
    context, hint = torch.randn(1, 77, 768), torch.randn(1, 3, 256, 256)
    with torch.no_grad():
        with FlopCounterMode(display=False) as counted:
            control(x=x, hint=hint, timesteps=t, context=context)
        control_gflop = counted.get_total_flops() / 1e9
        with FlopCounterMode(display=False) as counted:
            unet(x, t, context=context)
        unet_gflop = counted.get_total_flops() / 1e9
    print(f"control stage forward: {control_gflop:.1f} GFLOP; UNet forward: {unet_gflop:.1f} GFLOP (256 px)")


if __name__ == "__main__":
    main()
