"""controlnet_infer.py's config (NeMo v2.4.0 examples/multimodal/text_to_image/controlnet/conf/
controlnet_infer.yaml), every key the script reads, written by the samples job (launcher/jobs/samples.py):
sd_infer.yaml's keys as the samples job writes them (the same names), plus each prompt's hint image
(`control`, samples.json's program_inputs) resized to the trained side (`hint_image_size`), and the model's
`strength` and `guess_mode`.

controlnet_infer.py draws `num_images_per_prompt` images of a prompt in one batch (samples.batch_size is not
read) and names them `<prompt[:50]>_<i>.png` as sd_infer.py does, beside a `<prompt[:50]>_control.png` of the
last prompt's hint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from launcher.sampling.infer_config import infer_config as sd_infer_config
from launcher.sampling.settings import SamplingSettings


def infer_config(s: SamplingSettings, size: tuple[int, int], nemo_file: Path, out: Path) -> dict[str, Any]:
    height, width = size
    if height != width:
        # get_control_input resizes the hint to a square (L32): the control stage's features would not
        # match a non-square latent.
        raise SystemExit(
            f"samples: controlnet_infer.py draws square images only; trained at {height}x{width}"
        )
    config = sd_infer_config(s, size, nemo_file, out)
    config["infer"].update(
        control=list(s.program_inputs["hint_images"]),
        hint_image_size=height,
        control_image_preprocess=None,  # the hints are conditioning images already (Canny edges)
    )
    # strength 1 and no guess mode: the control scales ControlLDM trained with (controlnet.py's
    # control_scales); controlnet_infer.py sets `model.contol_scales` (a typo, L235), so strength is not
    # applied at v2.4.0 either way.
    config["model"].update(strength=1.0, guess_mode=False)
    return {**config, "name": "controlnet-samples"}
