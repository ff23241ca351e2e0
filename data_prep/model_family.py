"""Which of NeMo's two diffusion families a training config's `model` section describes.

SD 1.x/2.0 is NeMo's MegatronLatentDiffusion (`sd_train.py`; text encoder in `cond_stage_config`);
SDXL is NeMo's MegatronDiffusionEngine (`sd_xl_train.py`), whose text encoders and size/crop embedders
sit in `conditioner_config` (diffusion_engine.py reads `cfg.conditioner_config`; SD's model never does).
Works on a DictConfig or a plain dict (both have .get).

>>> is_sdxl({"conditioner_config": {"emb_models": []}}), is_sdxl({"cond_stage_config": {}})
(True, False)
"""

from __future__ import annotations

from typing import Any


def is_sdxl(model: Any) -> bool:
    """The config is an SDXL one (NeMo's MegatronDiffusionEngine)."""
    return bool(model.get("conditioner_config"))
