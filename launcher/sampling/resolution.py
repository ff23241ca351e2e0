"""The image size a diffusion model was trained at, read from its NeMo model config by its family
(launcher.families: SD's crop of `data.train.augmentations`, SDXL's square of `resize_smallest_side`).

>>> sd = {"cond_stage_config": {"_target_": "x.FrozenCLIPEmbedder"}}
>>> crop = {"resize_smallest_side": 256, "center_crop_h_w": "256, 256"}
>>> trained_size({**sd, "data": {"train": {"augmentations": crop}}})
(256, 256)
>>> xl = {"conditioner_config": {"emb_models": [{}]}}
>>> trained_size({**xl, "data": {"train": {"augmentations": {"resize_smallest_side": 512}}}})
(512, 512)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from launcher.families import family_of


def trained_size(model: Mapping[str, Any]) -> tuple[int, int] | None:
    """(height, width), or None when the config does not fix one (no crop, or no image data)."""
    return family_of(model).trained_size(model)
