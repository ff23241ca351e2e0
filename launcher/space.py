"""Free space against what data preparation will write, checked from the launching host when the data
folder is visible there (a login node that mounts /fsx); a warning before submitting, never a refusal:
the estimate is rough and other jobs free or fill the disk meanwhile.

What the steps write: download_images' raw tars and reorganize_tar's copy of them (the parquet and
the indexes are small). A stored image weighs about 0.18 bytes per pixel channel: 256 px center crops
at JPEG quality 95 averaged 35 KB over 41,609 PD12M-like samples (/work/shared/notes/data-path.md).
Own tars (data_preparation=webdataset_tars) are linked, so only reorganize_tar's copy counts. Rows are
known only for the demo and with download_parquet.max_rows; otherwise there is no estimate.

    >>> per_image_bytes(256)
    35389
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

BYTES_PER_PIXEL_CHANNEL = 0.18


def per_image_bytes(image_size: int) -> int:
    return int(image_size * image_size * 3 * BYTES_PER_PIXEL_CHANNEL)


def size(n: float) -> str:
    return f"{n / 1e9:,.2f} GB" if n >= 1e9 else f"{n / 1e6:,.1f} MB"


def _tar_bytes(folder: Path) -> int:
    """Bytes of the .tar files under `folder` (links followed), 0 when it does not exist."""
    total = 0
    for root, _, files in os.walk(folder, followlinks=True):
        for name in files:
            if name.endswith(".tar"):
                try:
                    total += (Path(root) / name).stat().st_size
                except OSError:
                    continue  # a dangling link: not data
    return total


def planned_bytes(cfg: Any) -> int | None:
    """What data preparation will add under data_dir, or None when it cannot be told in advance."""
    dp = cfg.data_preparation
    if dp.tars.enable:
        source = Path(dp.tars.source or "")
        return _tar_bytes(source) if "://" not in str(dp.tars.source) and source.is_dir() else None
    if not dp.download_images.enable or dp.download_images.resize_mode != "center_crop":
        return None  # originals ("no") or other modes: sizes depend on the web's images
    rows = dp.demo.num_images if dp.demo.enable else dp.download_parquet.max_rows
    return None if rows is None else 2 * rows * per_image_bytes(dp.download_images.image_size)


def free_space_warning(cfg: Any) -> str | None:
    """A warning when the data folder's file system has less free space than the planned output."""
    data_dir = Path(cfg.data_dir)
    visible = next((p for p in (data_dir, data_dir.parent) if p.is_dir()), None)
    needed = planned_bytes(cfg)
    if visible is None or needed is None:
        return None
    written = sum(_tar_bytes(data_dir / sub) for sub in ("tarfiles_raw", "tarfiles_reorganized"))
    free = shutil.disk_usage(visible).free
    if free >= needed - written:
        return None
    return (
        f"data_dir: {visible} has {size(free)} free but data preparation will write about "
        f"{size(needed - written)} more (raw and re-chunked tars); the steps would stop "
        "on a full disk. Free space, or point data_dir elsewhere"
    )
