"""The hint images ControlNet's samples are drawn from (controlnet_hints.hint_images), checked before anything
is submitted: NeMo's controlnet_infer.py (v2.4.0) asserts one `infer.control` path per prompt (L126) and reads
each with cv2.imread (L31), whose None for a missing or unreadable file crashes cv2.resize in the job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from launcher.config import Runtime
from launcher.errors import ConfigError
from launcher.stages.common import require_mounted

KEY = "controlnet_hints.hint_images"


def _check_image(key: str, path: str) -> None:
    import cv2

    if not Path(path).is_file():
        raise ConfigError(key, f"{path} does not exist; allowed: an existing image file (PNG, JPEG)")
    if cv2.imread(path) is None:
        raise ConfigError(
            key,
            f"{path} is not an image cv2.imread reads (as controlnet_infer.py reads it); allowed: a PNG or "
            "JPEG file",
        )


def program_inputs(cfg: Any) -> dict[str, Any]:
    """{"hint_images": one path per samples.prompts entry} (one given is used for every prompt)."""
    given, prompts = list(cfg.controlnet_hints.hint_images), list(cfg.samples.prompts)
    if len(given) not in (1, len(prompts)):
        raise ConfigError(
            KEY,
            f"has {len(given)} image(s) for {len(prompts)} samples.prompts: ControlNet draws each prompt from "
            "a hint image; allowed: one image per prompt, in their order, or one for all",
        )
    for i, path in enumerate(given):
        _check_image(f"{KEY}[{i}]", path)
        if cfg.container.runtime is Runtime.pyxis:
            require_mounted(f"{KEY}[{i}]", path, cfg.container.mounts)
    return {"hint_images": given * len(prompts) if len(given) == 1 else given}
