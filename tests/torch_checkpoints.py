"""Torch checkpoints written by torch itself (NeMo's interpreter), for the launcher's checks, which read them
without torch (launcher/checkpoint_index.py).

Each file is what Lightning saves, in small: `{"state_dict": ..., "global_step": ..., "hyper_parameters":
{"cfg": <an OmegaConf config>}}`, every tensor a zero expanded to its shape, so that a file holds the
shapes of a 860M UNet in a few KB.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

UNET_PREFIX = "model.model.diffusion_model."
# A few tensors of the 860M preset's UNet, names and shapes as NeMo 2.4.1's UNetModel builds it (its
# state_dict on the meta device): the time embedding, the first and last convolutions, one tensor of each
# input and output block, and the cross-attention keys of each spatial transformer (context_dim 768; one
# transformer block each: transformer_depth 1).
_ATTENTION = {
    "input_blocks.1.1": 320,
    "input_blocks.2.1": 320,
    "input_blocks.4.1": 640,
    "input_blocks.5.1": 640,
    "input_blocks.7.1": 1280,
    "input_blocks.8.1": 1280,
    "middle_block.1": 1280,
    **{f"output_blocks.{n}.1": 1280 for n in (3, 4, 5)},
    **{f"output_blocks.{n}.1": 640 for n in (6, 7, 8)},
    **{f"output_blocks.{n}.1": 320 for n in (9, 10, 11)},
}
UNET_860M: dict[str, tuple[int, ...]] = {
    "time_embed.0.weight": (1280, 320),
    "input_blocks.0.0.weight": (320, 4, 3, 3),
    "input_blocks.1.0.in_layers.0.weight": (320,),
    "input_blocks.2.0.in_layers.0.weight": (320,),
    "input_blocks.3.0.op.weight": (320, 320, 3, 3),
    "input_blocks.4.0.in_layers.0.weight": (320,),
    "input_blocks.5.0.in_layers.0.weight": (640,),
    "input_blocks.6.0.op.weight": (640, 640, 3, 3),
    "input_blocks.7.0.in_layers.0.weight": (640,),
    "input_blocks.8.0.in_layers.0.weight": (1280,),
    "input_blocks.9.0.op.weight": (1280, 1280, 3, 3),
    "input_blocks.10.0.in_layers.0.weight": (1280,),
    "input_blocks.11.0.in_layers.0.weight": (1280,),
    "output_blocks.0.0.in_layers.0.weight": (2560,),
    "output_blocks.1.0.in_layers.0.weight": (2560,),
    "output_blocks.2.0.in_layers.0.weight": (2560,),
    "output_blocks.3.0.in_layers.0.weight": (2560,),
    "output_blocks.4.0.in_layers.0.weight": (2560,),
    "output_blocks.5.0.in_layers.0.weight": (1920,),
    "output_blocks.6.0.in_layers.0.weight": (1920,),
    "output_blocks.7.0.in_layers.0.weight": (1280,),
    "output_blocks.8.0.in_layers.0.weight": (960,),
    "output_blocks.9.0.in_layers.0.weight": (960,),
    "output_blocks.10.0.in_layers.0.weight": (640,),
    "output_blocks.11.0.in_layers.0.weight": (640,),
    **{
        f"{block}.transformer_blocks.0.attn2.to_k.weight": (width, 768) for block, width in _ATTENTION.items()
    },
    "out.1.weight": (4, 320, 3, 3),
}
# Beside the UNet, as in every NeMo SD checkpoint: the VAE.
VAE = {"model.first_stage_model.decoder.conv_in.weight": (512, 4, 3, 3)}

_WRITER = r"""
import json, sys
from collections import OrderedDict

import torch
from omegaconf import OmegaConf

given = json.load(sys.stdin)
for path, tensors in given["files"].items():
    state = OrderedDict((name, torch.zeros(1).expand(*shape)) for name, shape in tensors.items())
    hyper = {"cfg": OmegaConf.create({"unet_config": {"model_channels": 320}})}
    saved = {"state_dict": state, "global_step": 8, "hyper_parameters": hyper}
    torch.save(saved, path, _use_new_zipfile_serialization=path not in given["legacy"])
"""


def unet_860m(compiled: bool = False, **changed: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    """The 860M UNet's tensors (with `changed` ones: name less the prefix -> shape) and the VAE's, by full
    name; `compiled`: as NeMo saves a UNet it compiled (model.inductor, torch.compile's `_orig_mod.`)."""
    unet = {**UNET_860M, **changed}
    prefix = UNET_PREFIX + ("_orig_mod." if compiled else "")
    return {**{prefix + name: shape for name, shape in unet.items()}, **VAE}


def write(
    nemo_python: str, files: dict[Path, dict[str, tuple[int, ...]]], legacy: frozenset[Path] = frozenset()
) -> None:
    """torch.save each file: path -> its state_dict's tensor names and shapes (one interpreter for all);
    those in `legacy` in torch's legacy (non-zip) format."""
    for path in files:
        path.parent.mkdir(parents=True, exist_ok=True)
    given = json.dumps(
        {"files": {str(path): tensors for path, tensors in files.items()}, "legacy": [str(p) for p in legacy]}
    )
    subprocess.run([nemo_python, "-c", _WRITER], input=given, text=True, check=True, timeout=300)
