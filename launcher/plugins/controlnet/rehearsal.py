"""ControlNet's parts of the rehearsal (Family.rehearsal): the control stage sized to the tiny UNet, and the one
image drawn from the trained ControlLDM. Job side: `tiny` runs where the rehearsal's config is derived (plain
dicts), `draw` in NeMo's interpreter on the model controlnet_train.py built."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from data_prep.cpu_model import set_value
from data_prep.latent_format import downsampling

PARAMS = "model.control_stage_config.params"
PROMPT = "a photograph of an astronaut riding a horse"
STEPS = 2
GUIDANCE = 7.5


def tiny(model: dict[str, Any], width: int, changes: list[str]) -> None:
    """The control stage copies the UNet's encoder and adds into its skip connections: the same width; and
    it starts from no full-size UNet (the rehearsal's UNet is tiny, from scratch)."""
    params = model.setdefault("control_stage_config", {}).setdefault("params", {})
    set_value(
        params,
        "model_channels",
        width,
        "the tiny UNet's: the control stage copies its encoder",
        changes,
        PARAMS,
    )
    if params.get("from_pretrained_unet"):
        set_value(params, "from_pretrained_unet", None, "a full-size UNet", changes, PARAMS)


def draw(module: Any, config: Any, size: tuple[int, int], out: Path) -> None:
    """ControlLDM through NeMo's DDIMSampler as controlnet_infer.py drives it (the hint as c_concat, the text as
    c_crossattn, guidance on both), from a blank hint of the trained size: DDIM, a few steps, fp32."""
    import torch
    from nemo.collections.multimodal.models.text_to_image.stable_diffusion.samplers.ddim import DDIMSampler
    from PIL import Image

    model = module.model
    model.eval()
    height, width = size
    factor = downsampling(config.model)
    with torch.no_grad():
        hint = torch.zeros(1, int(config.model.control_stage_config.params.hint_channels), height, width)
        text, empty = model.cond_stage_model.encode([PROMPT]), model.cond_stage_model.encode([""])
        latents = [height // factor, width // factor]
        noise = torch.randn(
            [1, model.model.diffusion_model.in_channels, *latents], generator=torch.Generator().manual_seed(0)
        )
        samples, _ = DDIMSampler(model).sample(
            S=STEPS,
            conditioning={"c_concat": hint, "c_crossattn": text},
            batch_size=1,
            shape=[1, *latents],  # controlnet_infer.py's: the batch, then the latents' size
            verbose=False,
            unconditional_guidance_scale=GUIDANCE,
            unconditional_conditioning={"c_concat": hint, "c_crossattn": empty},
            eta=0,
            x_T=noise,
        )
        images = torch.clamp((model.decode_first_stage(samples) + 1.0) / 2.0, 0.0, 1.0)
    pixels = (images[0].permute(1, 2, 0).numpy() * 255).round().astype("uint8")
    out.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(out)
