"""The model check's VAE load (data_prep.model_check.check_vae, NeMo's own AutoencoderKL code) on three files:
the SD 1.x stand-in VAE (pre-0.15 diffusers names), the same tensors saved under current diffusers' names, and
that file converted by the assets job's step (data_prep.vae_names.convert). Run with NeMo's interpreter:

    <nemo python> tests/nemo_cpu/vae_names_cpu.py SECTIONS.json SD_VAE WORK_DIR    # prints a JSON report

SECTIONS.json: {name: first_stage_config as the launcher composes it, from_pretrained aside}.
diffusers is not in NeMo's venv: the current-names file is written from the SD stand-in (itself NeMo's own
AutoencoderKL state dict under diffusers' old names, tests/nemo_cpu/tiny.py) by renaming the middle
attention's query/key/value/proj_attn to to_q/to_k/to_v/to_out.0 and storing those weights as the Linear
[C, C] that current diffusers saves.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CURRENT = {"query": "to_q", "key": "to_k", "value": "to_v", "proj_attn": "to_out.0"}


def save_current_diffusers(sd_vae: Path, out: Path) -> None:
    from safetensors.torch import load_file, save_file

    state = {}
    for key, value in load_file(str(sd_vae)).items():
        parts = key.split(".")
        if ".mid_block.attentions." in key and parts[-2] in CURRENT:
            key = ".".join([*parts[:-2], CURRENT[parts[-2]], parts[-1]])
            value = value.reshape(value.shape[:2]) if value.dim() == 4 else value
        state[key] = value.contiguous()
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out))


def checked(section: dict[str, Any], path: Path) -> dict[str, Any]:
    """check_vae's report, or its error; and the loaded weights (NeMo's own build) for comparison."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from data_prep.model_check import ModelCheckError, check_vae

    config = OmegaConf.create({"first_stage_config": {**section, "from_pretrained": str(path)}})
    try:
        return {"report": check_vae(config), "state": instantiate(config.first_stage_config).state_dict()}
    except ModelCheckError as exc:
        return {"error": str(exc)}


def main() -> None:
    sys.path.insert(0, str(REPO))
    import data_prep.nemo_compat  # noqa: F401  (apex GroupNorm absent off NVIDIA's container)
    from data_prep.vae_names import convert

    sections, sd_vae, work = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]), Path(sys.argv[3])
    current = work / "current/vae/diffusion_pytorch_model.safetensors"
    save_current_diffusers(sd_vae, current)
    converted = work / "current/diffusion_pytorch_model.safetensors"
    result: dict[str, Any] = {
        "renamed": convert(current, converted),
        "renamed_sd": convert(sd_vae, work / "sd_converted.safetensors"),
    }
    for name, section in sections.items():
        runs = {label: checked(section, path) for label, path in (("sd", sd_vae), ("current", current))}
        runs["converted"] = checked(section, converted)
        sd_state, new_state = runs["sd"].get("state", {}), runs["converted"].get("state", {})
        result[name] = {
            **{label: {k: v for k, v in run.items() if k != "state"} for label, run in runs.items()},
            # Every weight loaded from the converted file equals the one loaded from the SD stand-in.
            "same_weights": bool(sd_state)
            and sd_state.keys() == new_state.keys()
            and all(sd_state[k].equal(new_state[k]) for k in sd_state),
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
