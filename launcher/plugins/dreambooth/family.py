"""DreamBooth: NeMo's MegatronDreamBooth (examples/multimodal/text_to_image/dreambooth/dreambooth.py), an SD 1.x
model trained on one instance folder and prompt, with prior preservation on images its base model drew.
Claimed by what only its configs have (`model.data.instance_dir`), so it refines SD 1.x; it starts from the
same released weights (SD 1.5's) and reads no prepared data (Family.reads_prepared_data)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from launcher.errors import ConfigError
from launcher.families import sd1

NAME = "dreambooth"
DOCS = "launcher/plugins/dreambooth/docs/dreambooth.md"
# The stages a DreamBooth run cannot use yet: its checkpoints are MegatronDreamBooth's (unet/vae/text_encoder
# module names), which the samples and export jobs rewrite as SD 1.x's (checkpoint.py), not the evaluation's
# (it generates from the samples job's .nemo: not yet checked for DreamBooth); the rehearsal and the sweep run
# sd_train.py's MegatronLatentDiffusion.
NOT_BUILT = ("rehearsal", "benchmark", "evaluation")


def matches(model: Any) -> bool:
    return "instance_dir" in (model.get("data") or {})


def trained_size(model: Any) -> tuple[int, int] | None:
    """DreamBoothDataset resizes and crops every image to data.resolution (a square)."""
    side = (model.get("data") or {}).get("resolution")
    return (int(side), int(side)) if side else None


def sample_prompts(cfg: Any) -> dict[str, str]:
    """The subject (the instance prompt) and its class (the regularization prompt): a grid row of each shows
    what training taught and what it took from the class."""
    data = cfg.training.model.get("data") or {}
    keys = ("instance_prompt", "regularization_prompt")
    return {f"training.model.data.{key}": str(data[key]) for key in keys if data.get(key)}


def check(cfg: Any) -> None:
    if "data_check" in cfg.stages:  # NeMo's web-dataset loader on tars DreamBooth never reads
        raise ConfigError(
            "stages",
            "data_check reads the prepared tars, which DreamBooth does not train on; the dreambooth stage checks "
            "its instance folder (dreambooth.instance_dir) instead. Allowed: stages without data_check",
        )
    chosen = [name for name in NOT_BUILT if name in cfg.stages]
    if cfg.rehearsal.enable and "rehearsal" not in chosen:
        chosen.insert(0, "rehearsal")
    if chosen:
        rest = ",".join(name for name in cfg.stages if name not in NOT_BUILT) or "training"
        raise ConfigError(
            "rehearsal.enable" if chosen[0] == "rehearsal" and "rehearsal" not in cfg.stages else "stages",
            f"{chosen[0]} is not built for DreamBooth ({DOCS}: its checkpoints are MegatronDreamBooth's); "
            f"allowed: stages=[{rest}] with rehearsal.enable=false",
        )


FAMILY = dataclasses.replace(
    sd1.FAMILY,
    name=NAME,
    title="DreamBooth SD 1.x",
    matches=matches,
    refines=sd1.FAMILY.name,
    trained_size=trained_size,
    synthetic_keys=None,  # MegatronDreamBooth reads DreamBoothDataset only
    check=check,
    rehearsal=None,
    rehearsal_refusal="the rehearsal runs sd_train.py's MegatronLatentDiffusion, not dreambooth.py",
    inference=dataclasses.replace(
        sd1.FAMILY.inference,
        prompts=sample_prompts,
        checkpoint_as_model="launcher.plugins.dreambooth.checkpoint:as_sd",
    ),
    reads_prepared_data=False,
    # NeMo's dreambooth.py under the fix its LoRA needs (train.py: the NameError of NeMo's model module).
    training_program="launcher.plugins.dreambooth.train",
    conf=Path(__file__).resolve().parent / "conf",
)
