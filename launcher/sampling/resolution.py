"""The image size a Stable Diffusion model was trained at, read from its NeMo model config.

NeMo's training images are `data.train.augmentations` applied in order (construct_image_augmentations in
nemo/collections/multimodal/data/stable_diffusion/augmentation/augmentations.py, v2.0.0): a crop
`center_crop_h_w` / `random_crop_h_w` of "H, W" (passed to torchvision as (h, w)) fixes the size.

>>> trained_size({"data": {"train": {"augmentations": {"resize_smallest_side": 256, "center_crop_h_w": "256, 256"}}}})
(256, 256)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def trained_size(model: Mapping[str, Any]) -> tuple[int, int] | None:
    """(height, width), or None when the config does not fix one (no crop, or no image data)."""
    augmentations = ((model.get("data") or {}).get("train") or {}).get("augmentations") or {}
    for key in ("center_crop_h_w", "random_crop_h_w"):
        if augmentations.get(key):
            height, width = (int(part) for part in str(augmentations[key]).split(","))
            return height, width
    return None
