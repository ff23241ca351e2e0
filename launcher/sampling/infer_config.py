"""The configs of NeMo's inference programs that the samples job and the evaluation's generation write:
sd_infer.py's (and generate_fid_images.py's shared `infer` keys), every key given, and the parts a family's
own program config shares (the trainer, the .nemo to restore); the family's `inference.program` picks its
config (launcher.families; SDXL's sd_xl_infer.py config: launcher/plugins/sdxl/infer.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from launcher.families import named
from launcher.families.family import InferenceProgram
from launcher.sampling.settings import SamplingSettings


def infer_section(s: Any, size: tuple[int, int], out: Path, **given: Any) -> dict[str, Any]:
    """The `infer` keys sd_infer.yaml and sd_fid_images.yaml share, every one given, from settings `s`
    (samples' or the evaluation's); `given` sets the keys that differ."""
    return {
        "num_images_per_prompt": 1,
        "batch_size": s.batch_size,
        "height": size[0],
        "width": size[1],
        "down_factor": 8,
        "inference_steps": s.steps,
        "sampler_type": s.sampler,
        "eta": 0,
        "output_type": "pil",
        "out_path": str(out),
        "seed": s.seed,
        **given,
    }


def inference_trainer(precision: str) -> dict[str, Any]:
    """One GPU per process, no logger."""
    return {"devices": 1, "num_nodes": 1, "accelerator": "gpu", "precision": precision, "logger": False}


def trainer_and_model(precision: str, nemo_file: Path) -> dict[str, Any]:
    """The trainer, and the .nemo to restore."""
    model = {"restore_from_path": str(nemo_file), "precision": precision}
    return {"trainer": inference_trainer(precision), "model": model}


def infer_config(s: SamplingSettings, size: tuple[int, int], nemo_file: Path, out: Path) -> dict:
    """sd_infer.yaml's keys (examples/.../stable_diffusion/conf/sd_infer.yaml), every one given."""
    infer = infer_section(
        s,
        size,
        out,
        unconditional_guidance_scale=s.guidance_scale,
        num_images_per_prompt=s.images_per_prompt,
        save_to_file=True,
        prompts=list(s.prompts),
    )
    return {"name": "stable-diffusion-samples", "infer": infer, **trainer_and_model(s.precision, nemo_file)}


def program(s: Any) -> InferenceProgram:
    """The inference program of settings `s`'s family (samples' or the evaluation's)."""
    return named(s.family).inference.program
