"""The rehearsal's one image, drawn on CPU from the model step 2 trained and resumed, with NeMo's own
sampling code for its model class. The family names the function (launcher/families: its
`rehearsal.sampler`, here or in its plugin, e.g. launcher/plugins/sdxl/rehearsal.py) and the CPU patches it
needs first (`rehearsal.sampler_patches`, launcher/jobs/nemo_cpu.py).

Each function takes NeMo's LightningModule as sd_train.py / sd_xl_train.py built it, the tiny config, the
trained (height, width) and the PNG to write. A few steps only: this checks that the trained model samples
and decodes to an image, not what the image shows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from launcher.families.family import job_function

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


def draw(sampler: str, module: Any, config: Any, size: tuple[int, int], out: Path) -> None:
    """The family's sampler ("module:function") on the trained module."""
    job_function(sampler)(module, config, size, out)
