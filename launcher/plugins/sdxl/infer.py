"""sd_xl_infer.py's config (NeMo v2.4.0 examples/multimodal/text_to_image/stable_diffusion/conf/
sd_xl_infer.yaml), every key the script reads, as the samples job (`samples_config`) and the evaluation's
generation (launcher/plugins/sdxl/generate.py) write it, and what sd_xl_infer.py names its images."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from launcher.sampling.infer_config import inference_trainer
from launcher.sampling.settings import SamplingSettings


def sampling_base(sampler: str, steps: int, scale: float, size: tuple[int, int]) -> dict[str, Any]:
    """sd_xl_infer.yaml's `sampling.base` (v2.4.0), the keys SamplingPipeline.text_to_image reads
    (sdxl_pipeline.py: get_sampler_config, get_discretization_config, get_guider_config; sdxl_helpers.get_batch
    the size and crop ones): NVIDIA's values except the sampler, its steps, the guidance scale and the size."""
    height, width = size
    return {
        "sampler": sampler,
        "width": width,
        "height": height,
        "steps": steps,
        "discretization": "LegacyDDPMDiscretization",
        "guider": "VanillaCFG",
        "thresholder": "None",
        "scale": scale,
        "img2img_strength": 1.0,
        "sigma_min": 0.0292,
        "sigma_max": 14.6146,
        "rho": 3.0,
        "s_churn": 0.0,
        "s_tmin": 0.0,
        "s_tmax": 999.0,
        "s_noise": 1.0,
        "eta": 1.0,
        "order": 4,
        # The size conditioning: an image of the trained size, uncropped (as training saw it).
        "orig_width": width,
        "orig_height": height,
        "crop_coords_top": 0,
        "crop_coords_left": 0,
        "aesthetic_score": 5.0,
        "negative_aesthetic_score": 5.0,
    }


def infer_config(
    s: Any,
    size: tuple[int, int],
    nemo_file: Path,
    out: Path,
    *,
    prompts: Sequence[str],
    scale: float,
    seed: int,
    per_prompt: int,
) -> dict:
    """sd_xl_infer.yaml's keys (v2.4.0 examples/.../stable_diffusion/conf/sd_xl_infer.yaml), every one the
    script reads, from settings `s` (samples' or the evaluation's: sampler, steps, batch_size, precision);
    NVIDIA's values except those, the prompts, `per_prompt` images of each, the guidance scale (VanillaCFG's
    `sampling.base.scale`, get_guider_config in sdxl_pipeline.py), the trained size, and no refiner.
    sd_xl_infer draws prompt i's batch b with seed `infer.seed + 100 i + 200 b`."""
    base = sampling_base(s.sampler, s.steps, scale, size)
    # sd_xl_infer draws num_samples // num_samples_per_batch batches per prompt: a divisor, or images go missing.
    per_batch = max(n for n in range(1, per_prompt + 1) if per_prompt % n == 0 and n <= s.batch_size)
    infer = {
        "num_samples": per_prompt,
        "num_samples_per_batch": per_batch,
        "prompt": list(prompts),
        "negative_prompt": "",
        "seed": seed,
    }
    return {
        "trainer": inference_trainer(s.precision),
        "model": {"restore_from_path": str(nemo_file), "is_legacy": False},
        "infer": infer,
        "sampling": {"base": base},
        "use_refiner": False,
        "use_fp16": False,
        "out_path": str(out),
    }


def samples_config(s: SamplingSettings, size: tuple[int, int], nemo_file: Path, out: Path) -> dict:
    """sd_xl_infer's config for the samples job: its prompts, guidance, seed and images per prompt."""
    given = {
        "prompts": s.prompts,
        "scale": s.guidance_scale,
        "seed": s.seed,
        "per_prompt": s.images_per_prompt,
    }
    return infer_config(s, size, nemo_file, out, **given)


def image_numbered(s: SamplingSettings, row: int, column: int) -> str:
    """What sd_xl_infer names an image: `{n:09}.png` counted over the prompts in order
    (perform_save_locally), each prompt's images together."""
    return f"{row * s.images_per_prompt + column:09}.png"
