"""NeMo's text-to-image inference (`.../stable_diffusion/sd_infer.py`) on CPU, for tests: same CLI.

    <nemo python> tests/nemo_cpu/sd_infer_cpu.py --config-path DIR --config-name sd_infer.yaml

The script is not in NeMo's wheel. With NEMO_SD_INFER=<path to that file> this runs it as is; without,
`sd_infer_main()` below makes the same calls (v2.0.0 and v2.4.0 are identical): the same
model_cfg_modifier, `setup_trainer_and_model_for_inference(MegatronLatentDiffusion, ...)` (which restores
the .nemo), `model.cuda().eval()`, a CPU torch.Generator seeded with infer.seed, NeMo's `pipeline`.
NVIDIA's v2.0.0 file run through this runner (NEMO_SD_INFER) wrote byte-identical images.

CUDA-only calls replaced, besides training's (sd_train_cpu.patch_for_cpu):
- torch.nn.Module.cuda and Lightning's override of it -> the module itself (sd_infer.py and
  setup_trainer_and_model_for_inference call model.cuda());
- samplers/base_sampler.py register_buffer moves every schedule tensor to "cuda" -> kept where it is;
- trainer.accelerator gpu -> cpu (a Hydra override appended to the command line). Lightning turns the
  config's 16-bit precision into bf16-mixed on CPU, and the pipeline's torch.cuda.amp.autocast is a
  no-op without CUDA: the CPU samples are computed in fp32.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sd_train_cpu import patch_for_cpu, run_hydra_entry

from launcher.jobs.nemo_cpu import patch_sampler_for_cpu

CPU_OVERRIDE = "trainer.accelerator=cpu"


def patch_infer_for_cpu() -> list[str]:
    import torch

    done = [*patch_for_cpu(), *patch_sampler_for_cpu()]
    from lightning.fabric.utilities.device_dtype_mixin import _DeviceDtypeModuleMixin

    # Lightning modules override Module.cuda (it asks torch.cuda.current_device() for an index).
    for module_class in (torch.nn.Module, _DeviceDtypeModuleMixin):
        module_class.cuda = lambda self, *_a, **_k: self  # type: ignore[method-assign]
    done.append("torch.nn.Module.cuda() and Lightning's module .cuda() -> the module itself")

    sys.argv.append(CPU_OVERRIDE)
    done.append(f"Hydra override {CPU_OVERRIDE}")
    return done


def inference_model_cfg(model_cfg: Any, precision: Any) -> None:
    """The model config changes sd_infer.py's and generate_fid_images.py's model_cfg_modifier share."""
    model_cfg.precision = precision
    model_cfg.ckpt_path = None
    model_cfg.inductor = False
    model_cfg.unet_config.use_flash_attention = False
    model_cfg.unet_config.from_pretrained = None
    model_cfg.first_stage_config.from_pretrained = None


def sd_infer_main(cfg: Any) -> None:
    """What sd_infer.py's main() does."""
    import torch
    from nemo.collections.multimodal.models.text_to_image.stable_diffusion.ldm.ddpm import (
        MegatronLatentDiffusion,
    )
    from nemo.collections.multimodal.parts.stable_diffusion.pipeline import pipeline
    from nemo.collections.multimodal.parts.utils import setup_trainer_and_model_for_inference

    def model_cfg_modifier(model_cfg: Any) -> None:
        inference_model_cfg(model_cfg, cfg.trainer.precision)
        model_cfg.first_stage_config._target_ = (
            "nemo.collections.multimodal.models.text_to_image.stable_diffusion.ldm.autoencoder.AutoencoderKL"
        )

    torch.backends.cuda.matmul.allow_tf32 = True
    _trainer, megatron_diffusion_model = setup_trainer_and_model_for_inference(
        model_provider=MegatronLatentDiffusion, cfg=cfg, model_cfg_modifier=model_cfg_modifier
    )
    model = megatron_diffusion_model.model
    model.cuda().eval()
    rng = torch.Generator().manual_seed(cfg.infer.seed)
    pipeline(model, cfg, rng=rng)


def main() -> None:
    run_hydra_entry("sd_infer_cpu", patch_infer_for_cpu(), "NEMO_SD_INFER", "sd_infer", sd_infer_main)


if __name__ == "__main__":
    main()
