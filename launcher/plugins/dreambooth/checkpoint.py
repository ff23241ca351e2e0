"""A DreamBooth training checkpoint as the SD 1.x model it is, for NeMo's conversion and inference (the samples
job: Inference.checkpoint_as_model). MegatronDreamBooth keeps the UNet, VAE and text encoder as model.unet,
model.vae and model.text_encoder and its noise schedule under model.noise_scheduler; NeMo's
MegatronLatentDiffusion.load_from_checkpoint renames them to its own only when the first key is the text
encoder's position_ids (ddpm.py, NeMo v2.4.0), a buffer transformers has not saved since 4.31
(persistent=False): so NeMo's own conversion refuses the checkpoint (unexpected keys). The same renames here,
by prefix, and the config without what only DreamBooth reads: an SD 1.x MegatronLatentDiffusion's.
Runs in NeMo's interpreter (torch, omegaconf)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from launcher.sampling.nemo_archive import rewritten_checkpoint

# MegatronDreamBooth's module prefixes -> MegatronLatentDiffusion's (NeMo's own renames, ddpm.py).
RENAMED = (
    ("model.unet.", "model.model.diffusion_model."),
    ("model.vae.", "model.first_stage_model."),
    ("model.text_encoder.", "model.cond_stage_model."),
    ("model.noise_scheduler.", "model."),  # the schedule's buffers (betas, ...), LatentDiffusion's own
)
# What MegatronDreamBooth reads and MegatronLatentDiffusion does not: its dataset and prior preservation.
DREAMBOOTH_KEYS = (
    "data",
    "with_prior_preservation",
    "prior_loss_weight",
    "train_text_encoder",
    "noise_scheduler",
)


def renamed(key: str) -> str:
    for before, after in RENAMED:
        if key.startswith(before):
            return after + key.removeprefix(before)
    raise ValueError(f"{key}: not a tensor of MegatronDreamBooth's UNet, VAE, text encoder or noise schedule")


def sd_config(model: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in model.items() if key not in DREAMBOOTH_KEYS}


def as_sd(checkpoint: Path, model: dict[str, Any], folder: Path) -> None:
    """<folder>/checkpoints/<checkpoint's name> and <folder>/hparams.yaml: the checkpoint and its config as
    MegatronLatentDiffusion's (a LoRA run's adapters renamed alike: merged after)."""
    rewritten_checkpoint(
        checkpoint,
        folder,
        sd_config(model),
        lambda state: {renamed(key): value for key, value in state.items()},
    )
