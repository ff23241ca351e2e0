"""The rehearsal's one image, drawn on CPU from the model step 2 trained and resumed, with NeMo's own
sampling code for its model class. The family names the function here (launcher/families: its
`rehearsal.sampler`) and the CPU patches it needs first (`rehearsal.sampler_patches`, launcher/jobs/nemo_cpu.py).

Each function takes NeMo's LightningModule as sd_train.py / sd_xl_train.py built it, the tiny config, the
trained (height, width) and the PNG to write. A few steps only: this checks that the trained model samples
and decodes to an image, not what the image shows.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from launcher.sampling.infer_config import xl_sampling_base

PROMPT = "a photograph of an astronaut riding a horse"
STEPS = 2
GUIDANCE = 7.5


def _save(image: Any, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    image.save(out)


def latent_diffusion(module: Any, config: Any, size: tuple[int, int], out: Path) -> None:
    """MegatronLatentDiffusion's LatentDiffusion through NeMo's SD pipeline (parts/stable_diffusion/
    pipeline.py, as sd_infer.py calls it): DDIM, guidance 7.5."""
    import torch
    from nemo.collections.multimodal.parts.stable_diffusion.pipeline import pipeline
    from omegaconf import OmegaConf

    from data_prep.latent_format import downsampling

    infer = {
        "prompts": [PROMPT],
        "num_images_per_prompt": 1,
        "height": size[0],
        "width": size[1],
        "down_factor": downsampling(config.model),
        "inference_steps": STEPS,
        "sampler_type": "DDIM",
        "unconditional_guidance_scale": GUIDANCE,
        "output_type": "pil",
        "save_to_file": False,
    }
    settings = OmegaConf.create({"trainer": {"precision": config.trainer.precision}, "infer": infer})
    model = module.model
    model.eval()
    images = pipeline(model, settings, verbose=False, rng=torch.Generator().manual_seed(0))
    _save(images[0][0], out)


# get_sampler_config's first sampler: the family's default (sd_xl_infer.yaml's too).
ENGINE_SAMPLER = "EulerEDMSampler"


def diffusion_engine(module: Any, config: Any, size: tuple[int, int], out: Path) -> None:
    """MegatronDiffusionEngine's DiffusionEngine as sd_xl_infer.py (v2.4.0) samples it: NeMo's
    SamplingPipeline.text_to_image, an uncropped image of the trained size as the size conditioning,
    float32 (use_fp16 false, as the samples stage runs it)."""
    import torch
    from omegaconf import OmegaConf
    from PIL import Image

    # Imported by name: this module names no model family (tests/test_families.py).
    pipelines = importlib.import_module("nemo.collections.multimodal.parts.stable_diffusion.sdxl_pipeline")
    params = xl_sampling_base(ENGINE_SAMPLER, STEPS, GUIDANCE, size)
    engine = module.model
    engine.eval()
    with torch.no_grad():
        base = pipelines.SamplingPipeline(
            engine, device="cpu", use_fp16=False, is_legacy=bool(config.model.get("is_legacy", False))
        )
        samples = base.text_to_image(
            params=OmegaConf.create(params), prompt=[PROMPT], negative_prompt="", samples=1, seed=0
        )
    # perform_save_locally's conversion (sdxl_helpers.py): [0, 1] CHW -> 8-bit HWC.
    pixels = (255.0 * samples[0].float().permute(1, 2, 0)).round().to(torch.uint8).numpy()
    _save(Image.fromarray(pixels), out)


def draw(sampler: str, module: Any, config: Any, size: tuple[int, int], out: Path) -> None:
    """The family's sampler ("module:function") on the trained module."""
    name, function = sampler.split(":")
    getattr(importlib.import_module(name), function)(module, config, size, out)
