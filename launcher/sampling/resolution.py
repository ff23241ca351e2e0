"""The image size a Stable Diffusion model was trained at, read from its NeMo model config.

NeMo's training images are `data.train.augmentations` applied in order (construct_image_augmentations in
nemo/collections/multimodal/data/stable_diffusion/augmentation/augmentations.py, v2.0.0): a crop
`center_crop_h_w` / `random_crop_h_w` of "H, W" (passed to torchvision as (h, w)) fixes the size. NeMo's
SDXL loader (build_sdxl_train_valid_datasets) crops a square of `resize_smallest_side` itself.

>>> trained_size({"data": {"train": {"augmentations": {"resize_smallest_side": 256, "center_crop_h_w": "256, 256"}}}})
(256, 256)
>>> sdxl = {"conditioner_config": {"emb_models": []}}
>>> trained_size({**sdxl, "data": {"train": {"augmentations": {"resize_smallest_side": 512}}}})
(512, 512)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from data_prep.model_family import is_sdxl


def trained_size(model: Mapping[str, Any]) -> tuple[int, int] | None:
    """(height, width), or None when the config does not fix one (no crop, or no image data)."""
    augmentations = ((model.get("data") or {}).get("train") or {}).get("augmentations") or {}
    side = augmentations.get("resize_smallest_side")
    if is_sdxl(model) and side:
        return int(side), int(side)
    for key in ("center_crop_h_w", "random_crop_h_w"):
        if augmentations.get(key):
            height, width = (int(part) for part in str(augmentations[key]).split(","))
            return height, width
    return None
