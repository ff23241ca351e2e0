"""SDXL's rehearsal image (Family.rehearsal.sampler): drawn on CPU, in NeMo's interpreter, from the
MegatronDiffusionEngine sd_xl_train.py trained 2 steps and resumed, as sd_xl_infer.py draws: a few steps, the
prompt and guidance of the rehearsal's other samplers (launcher/jobs/rehearsal_sample.py)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from launcher.plugins.sdxl.infer import sampling_base

PROMPT = "a photograph of an astronaut riding a horse"
STEPS = 2
GUIDANCE = 7.5

# get_sampler_config's first sampler: the family's default (sd_xl_infer.yaml's too).
ENGINE_SAMPLER = "EulerEDMSampler"


def draw(module: Any, config: Any, size: tuple[int, int], out: Path) -> None:
    """MegatronDiffusionEngine's DiffusionEngine as sd_xl_infer.py (v2.4.0) samples it: NeMo's
    SamplingPipeline.text_to_image, an uncropped image of the trained size as the size conditioning,
    float32 (use_fp16 false, as the samples stage runs it)."""
    import torch
    from nemo.collections.multimodal.parts.stable_diffusion import sdxl_pipeline as pipelines
    from omegaconf import OmegaConf
    from PIL import Image

    params = sampling_base(ENGINE_SAMPLER, STEPS, GUIDANCE, size)
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
    out.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(out)


@functools.cache  # once per process, as launcher/jobs/nemo_cpu.py's patches
def patch_sampling_for_cpu() -> list[str]:
    """MegatronDiffusionEngine's sampling (sd_xl_infer.py's path, NeMo v2.4.0) on CPU: SamplingPipeline.text_to_image
    calls sdxl_helpers.do_sample and get_batch without a device, whose defaults are "cuda", as are
    BaseDiffusionSampler's (diffusionmodules/sampling.py): the same calls on CPU. do_sample wraps sampling
    in torch.autocast(device): bfloat16 on CPU where CUDA computes float16; disabled, CPU samples are float32."""
    import torch
    from nemo.collections.multimodal.modules.stable_diffusion.diffusionmodules import sampling
    from nemo.collections.multimodal.parts.stable_diffusion import sdxl_helpers, sdxl_pipeline

    functions = [
        sdxl_pipeline.SamplingPipeline.__init__,
        sampling.BaseDiffusionSampler.__init__,
        sdxl_helpers.do_sample,
        sdxl_helpers.get_batch,
    ]
    for function in functions:  # device="cuda" defaults -> "cpu", for every caller that leaves it out
        if function.__defaults__:
            function.__defaults__ = tuple("cpu" if d == "cuda" else d for d in function.__defaults__)
    sdxl_helpers.autocast = lambda device, **_k: torch.autocast(device, enabled=False)
    return [
        f"device='cuda' defaults -> 'cpu' in {len(functions)} functions of NeMo's diffusion-engine sampling",
        "sdxl_helpers' autocast(device) -> disabled (CPU autocast would compute bfloat16)",
    ]
