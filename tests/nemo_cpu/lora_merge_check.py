"""A LoRA run's checkpoint merged by launcher/sampling/lora_merge.py, checked against what NeMo's own forward of
the trained UNet (adapters and all) gave: the UNet of the merged state dict, built by NeMo from the run's config
without peft, on sd_train_cpu.unet_probe's fixed input; and the same UNet with the base weights alone, which
must differ (else the adapters changed nothing and the check could not fail).

    <nemo python> tests/nemo_cpu/lora_merge_check.py HPARAMS.yaml CHECKPOINT EXPECTED.pt   # prints JSON
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from sd_train_cpu import unet_probe

from launcher.jobs.nemo_cpu import patch_for_cpu
from launcher.sampling.lora_merge import MODEL_PREFIX, base_config, inner_model, merged_state

UNET = "model.model.diffusion_model."


def _output(model: dict[str, Any], state: dict[str, Any]) -> Any:
    from hydra.utils import instantiate

    section = OmegaConf.create({**base_config(model)["unet_config"], "from_pretrained": None})
    section.use_flash_attention = False
    unet = instantiate(section).eval()
    unet.load_state_dict(
        {k.removeprefix(UNET): v for k, v in state.items() if k.startswith(UNET)}, strict=True
    )
    config = model["unet_config"]
    adm = config.get("adm_in_channels") if config.get("num_classes") == "sequential" else None
    return unet_probe(unet, int(config["context_dim"]), adm)


def main(hparams: Path, checkpoint: Path, expected: Path) -> dict[str, float]:
    patch_for_cpu()
    model = OmegaConf.to_container(OmegaConf.load(hparams).cfg, resolve=True)
    adapters = torch.load(checkpoint, map_location="cpu", weights_only=False)["state_dict"]
    trained = torch.load(expected)
    merged = _output(model, merged_state(model, adapters))
    base = _output(model, {MODEL_PREFIX + k: v for k, v in inner_model(model).state_dict().items()})
    return {
        "max_difference": float((merged - trained).abs().max()),
        "base_difference": float((base - trained).abs().max()),
        "scale": float(trained.abs().max()),
    }


if __name__ == "__main__":
    print(json.dumps(main(*map(Path, sys.argv[1:4]))))
