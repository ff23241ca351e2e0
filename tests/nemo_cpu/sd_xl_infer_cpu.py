"""NeMo's SDXL text-to-image inference (`.../stable_diffusion/sd_xl_infer.py`) on CPU, for tests: same CLI.

    <nemo python> tests/nemo_cpu/sd_xl_infer_cpu.py --config-path DIR --config-name sd_xl_infer.yaml

Run under torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_*): NeMo's inference setup reads
LOCAL_RANK (plain python: KeyError 'LOCAL_RANK'). The script is not in NeMo's wheel. With
NEMO_SD_XL_INFER=<path to that file> this runs it as is; without, `sd_xl_infer_main()` below makes the same
calls as v2.4.0's: its model_cfg_modifier, `setup_trainer_and_model_for_inference(MegatronDiffusionEngine,
...)` (which restores the .nemo strictly), `model.cuda().eval()`, NeMo's SamplingPipeline per prompt and
batch with seed `infer.seed + i * 100 + batch * 200`, `perform_save_locally` (`{n:09}.png` in out_path).

CUDA-only calls replaced, besides training's and SD inference's (sd_infer_cpu.patch_infer_for_cpu): the
rehearsal's, launcher/plugins/sdxl/rehearsal.py `patch_sampling_for_cpu` (the `device="cuda"` defaults of
NeMo's SDXL sampling code -> "cpu"; sdxl_helpers' autocast disabled: the CPU samples are float32).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sd_infer_cpu import patch_infer_for_cpu
from sd_train_cpu import run_hydra_entry

from launcher.plugins.sdxl.rehearsal import patch_sampling_for_cpu


def sd_xl_infer_main(cfg: Any) -> None:
    """What sd_xl_infer.py's main() does (without the refiner, which the samples stage does not use)."""
    import torch
    from nemo.collections.multimodal.models.text_to_image.stable_diffusion.diffusion_engine import (
        MegatronDiffusionEngine,
    )
    from nemo.collections.multimodal.parts.stable_diffusion.sdxl_helpers import perform_save_locally
    from nemo.collections.multimodal.parts.stable_diffusion.sdxl_pipeline import SamplingPipeline
    from nemo.collections.multimodal.parts.utils import setup_trainer_and_model_for_inference

    if cfg.get("use_refiner", False):
        raise SystemExit("use_refiner needs the real sd_xl_infer.py (set NEMO_SD_XL_INFER)")

    def model_cfg_modifier(model_cfg: Any) -> None:
        model_cfg.precision = cfg.trainer.precision
        model_cfg.ckpt_path = None
        model_cfg.inductor = False
        model_cfg.first_stage_config._target_ = (
            "nemo.collections.multimodal.models.text_to_image.stable_diffusion.ldm.autoencoder."
            "AutoencoderKLInferenceWrapper"
        )

    torch.backends.cuda.matmul.allow_tf32 = True
    _trainer, megatron_diffusion_model = setup_trainer_and_model_for_inference(
        model_provider=MegatronDiffusionEngine, cfg=cfg, model_cfg_modifier=model_cfg_modifier
    )
    model = megatron_diffusion_model.model
    model.cuda().eval()
    with torch.no_grad():
        base = SamplingPipeline(model, use_fp16=cfg.use_fp16, is_legacy=cfg.model.is_legacy)
        per_batch = cfg.infer.get("num_samples_per_batch", cfg.infer.num_samples)
        for i, prompt in enumerate(cfg.infer.prompt):
            for batch in range(cfg.infer.num_samples // per_batch):
                samples = base.text_to_image(
                    params=cfg.sampling.base,
                    prompt=[prompt],
                    negative_prompt=cfg.infer.negative_prompt,
                    samples=per_batch,
                    return_latents=False,
                    seed=int(cfg.infer.seed + i * 100 + batch * 200),
                )
                perform_save_locally(cfg.out_path, samples)


def main() -> None:
    patched = [*patch_infer_for_cpu(), *patch_sampling_for_cpu()]
    run_hydra_entry("sd_xl_infer_cpu", patched, "NEMO_SD_XL_INFER", "sd_xl_infer", sd_xl_infer_main)


if __name__ == "__main__":
    main()
