"""NeMo's SDXL training (`sd_xl_train.py`) run on CPU, for tests: same CLI, same code path.

    <nemo python> tests/nemo_cpu/sd_xl_train_cpu.py --config-path DIR --config-name NAME.yaml

The same CUDA/apex patches as SD's (launcher/jobs/nemo_cpu.py `patch_for_cpu`; none is SDXL's own), and the
same report of the pretrained UNet's key matches (sd_train_cpu.report_unet_load: one UNetModel for both).
FSDP needs a GPU (torch: "FSDP needs a non-CPU accelerator device"), so the configs run here have
`model.fsdp: false`: Lightning then gets NeMo's DDP strategy.

`examples/multimodal/text_to_image/stable_diffusion/sd_xl_train.py` is not in NeMo's wheel. With
NEMO_SD_XL_TRAIN=<path to that file> this runs it as is; without, `sd_xl_train_main()` below makes the
same calls in the same order as v2.4.0's: a MegatronTrainerBuilder whose strategy is NLPFSDPStrategy with
model.fsdp and NLPDDPStrategy without, exp_manager, MegatronDiffusionEngine, fit. Not re-created: the PEFT
branch (refused) and the notebook strategy of an interactive session. NVIDIA's own v2.4.0 file, run with
NEMO_SD_XL_TRAIN, trains the tiny stage-1 preset 2 steps here too (checked by hand: it is not in the wheel).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sd_train_cpu import add_adapters, patch_for_cpu, report_unet_load, report_unet_output, run_hydra_entry


def trainer_builder() -> type:
    """v2.4.0 sd_xl_train.py's MegatronStableDiffusionTrainerBuilder: NeMo's MegatronTrainerBuilder with its
    _training_strategy (NLPFSDPStrategy with model.fsdp, NLPDDPStrategy without; the notebook branch aside).
    tests/nemo_cpu/fsdp_strategy_cpu.py builds its strategy from the rendered configs."""
    from nemo.collections.nlp.parts.megatron_trainer_builder import MegatronTrainerBuilder
    from nemo.collections.nlp.parts.nlp_overrides import NLPDDPStrategy, NLPFSDPStrategy

    class Builder(MegatronTrainerBuilder):
        def _training_strategy(self) -> NLPDDPStrategy:
            if self.cfg.model.get("fsdp", False):
                assert self.cfg.model.optim.get("name") != "distributed_fused_adam", (
                    "Distributed optimizer cannot be used with FSDP."
                )
                if self.cfg.model.get("megatron_amp_O2", False):
                    self.cfg.model.megatron_amp_O2 = False  # v2.4.0: FSDP is not compatible with O2
                return NLPFSDPStrategy(
                    limit_all_gathers=self.cfg.model.get("fsdp_limit_all_gathers", True),
                    sharding_strategy=self.cfg.model.get("fsdp_sharding_strategy", "full"),
                    cpu_offload=self.cfg.model.get("fsdp_cpu_offload", False),
                    grad_reduce_dtype=self.cfg.model.get("fsdp_grad_reduce_dtype", 32),
                    precision=self.cfg.trainer.precision,
                    use_orig_params=self.cfg.model.inductor,
                    set_buffer_dtype=self.cfg.get("fsdp_set_buffer_dtype", None),
                )
            return NLPDDPStrategy(
                no_ddp_communication_hook=(not self.cfg.model.get("ddp_overlap")),
                gradient_as_bucket_view=self.cfg.model.gradient_as_bucket_view,
                find_unused_parameters=False,
            )

    return Builder


def sd_xl_train_main(cfg: Any) -> None:
    """What sd_xl_train.py's main() does for the presets (see the module docstring)."""
    import torch
    from nemo.collections.multimodal.models.text_to_image.stable_diffusion.diffusion_engine import (
        MegatronDiffusionEngine,
    )
    from nemo.utils.exp_manager import exp_manager

    torch.backends.cuda.matmul.allow_tf32 = True
    trainer = trainer_builder()(cfg).create_trainer()
    exp_manager(trainer, cfg.exp_manager)
    model = MegatronDiffusionEngine(cfg.model, trainer)
    add_adapters(model, cfg)
    trainer.fit(model)


def main() -> None:
    patched = patch_for_cpu()
    report_unet_load()
    report_unet_output()
    run_hydra_entry("sd_xl_train_cpu", patched, "NEMO_SD_XL_TRAIN", "sd_xl_base_train", sd_xl_train_main)


if __name__ == "__main__":
    main()
