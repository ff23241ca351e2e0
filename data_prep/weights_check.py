"""Released weights (training.weights) checked with NeMo's and diffusers' own code on CPU, before any GPU time.

NeMo builds the UNet from the training config and loads the staged file through its own path
(`unet_config.from_pretrained`: its diffusers mapping, or the launcher's names with from_NeMo), and only LOGS
what did not fit; SDXL's UNet through NeMo's mapping alone keeps 42% of its parameters random. So the tensors
are counted here by value: every tensor of NeMo's UNet must equal the released tensor it comes from
(data_prep.unet_names gives which), none may stay as NeMo initialised it, no released tensor may be left out.
Then diffusers' own UNet2DConditionModel from the same folder and NeMo's UNet so loaded must give the same
output on the same small input (fp32, integer timesteps; SDXL's vector conditioning assembled by NeMo's own
size embedder on one side and diffusers' time_ids on the other): a mapping that permutes two tensors of one
shape passes the count and fails here. A failure names the first keys and the unet_config keys that differ
from the release's config (the likely fault).

    check_released(model, Path("<the release's diffusers folder>")) -> report (raises WeightsCheckError)
"""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from data_prep.unet_names import Layout, UnetNamesError, diffusers_to_nemo, nemo_args, unet_differences

UNET_KEY = "training.model.unet_config"
# Max |NeMo - diffusers| allowed, relative to diffusers' largest output value (fp32 on CPU: the two differ by
# the order of their sums only).
TOLERANCE = 1e-4
_LATENT_SIDE = 16  # small enough for a few seconds on CPU at full width, with every level's attention
_TIMESTEPS = (17, 999)  # NeMo indexes its timestep embedding by int(t), 0..999


class WeightsCheckError(Exception):
    """The released weights do not fit the UNet the config builds: the message names keys and the fix."""


def _fault(model: DictConfig, config: dict[str, Any]) -> str:
    """The unet_config keys that differ from the release's own config (the likely fault), or a hint."""
    differ = unet_differences(nemo_args(config), OmegaConf.to_container(model.unet_config, resolve=True))
    return f"{UNET_KEY} differs from the release: {'; '.join(differ)}" if differ else "the mapping of names"


def _count(unet: Any, source: dict[str, Any], layout: Layout) -> dict[str, list[str]]:
    """NeMo's tensors not equal to their released one, and the released ones that filled none."""
    import torch

    mine = unet.state_dict()
    origin: dict[str, str] = {}
    for key in source:
        try:
            origin[diffusers_to_nemo(key, layout)] = key
        except UnetNamesError:
            continue  # reported as not used below
    wrong = []
    for key, value in mine.items():
        theirs = source.get(origin.get(key, ""))
        if theirs is None or theirs.shape != value.shape or not torch.equal(theirs.to(value.dtype), value):
            wrong.append(key)
    used = {origin[key] for key in mine if key in origin}
    return {"not_filled": wrong, "not_used": sorted(set(source) - used)}


def _nemo_unet(model: DictConfig) -> Any:
    from hydra.utils import instantiate

    section = OmegaConf.create(OmegaConf.to_container(model.unet_config, resolve=True))
    section.use_flash_attention = False  # a CUDA kernel; the same weights with torch's attention
    return instantiate(section).float().eval()


def _inputs(config: dict[str, Any]) -> dict[str, Any]:
    import torch

    generator = torch.Generator().manual_seed(0)
    batch = len(_TIMESTEPS)
    inputs = {
        "x": torch.randn(
            batch, int(config.get("in_channels", 4)), _LATENT_SIDE, _LATENT_SIDE, generator=generator
        ),
        "t": torch.tensor(_TIMESTEPS),
        "context": torch.randn(batch, 77, int(config["cross_attention_dim"]), generator=generator),
    }
    if config.get("addition_embed_type") == "text_time":
        pooled = int(config["projection_class_embeddings_input_dim"]) - 6 * int(
            config["addition_time_embed_dim"]
        )
        inputs["pooled"] = torch.randn(batch, pooled, generator=generator)
        inputs["time_ids"] = torch.tensor([[1024.0, 768.0, 0.0, 32.0, 1024.0, 1024.0]] * batch)
    return inputs


def _nemo_vector(inputs: dict[str, Any], config: dict[str, Any]) -> Any:
    """SDXL's `y` as NeMo's conditioner builds it: the pooled text, then NeMo's own embedder of each
    (original size, crop, target) pair."""
    import torch
    from nemo.collections.multimodal.modules.stable_diffusion.encoders.modules import ConcatTimestepEmbedderND

    embed = ConcatTimestepEmbedderND(int(config["addition_time_embed_dim"]), device="cpu")
    pairs = [embed(inputs["time_ids"][:, i : i + 2]) for i in (0, 2, 4)]
    return torch.cat([inputs["pooled"], *pairs], dim=1)


def _nemo_output(unet: Any, inputs: dict[str, Any], config: dict[str, Any]) -> Any:
    import torch

    with torch.no_grad():
        kwargs = {"y": _nemo_vector(inputs, config)} if "pooled" in inputs else {}
        return unet(inputs["x"], inputs["t"], context=inputs["context"], **kwargs)


def _diffusers_output(unet_dir: Path, inputs: dict[str, Any]) -> Any:
    import torch
    from diffusers import UNet2DConditionModel

    theirs = UNet2DConditionModel.from_pretrained(unet_dir, torch_dtype=torch.float32, local_files_only=True)
    added = {"text_embeds": inputs["pooled"], "time_ids": inputs["time_ids"]} if "pooled" in inputs else None
    with torch.no_grad():
        out = theirs.eval()(
            inputs["x"], inputs["t"], encoder_hidden_states=inputs["context"], added_cond_kwargs=added
        )
    return out.sample


def check_released(model: DictConfig, release: Path) -> dict[str, Any]:
    """The UNet NeMo builds and loads from `model` (the resolved training config's model section) against
    the release in `release` (its diffusers folder); returns the report, raises WeightsCheckError."""
    from safetensors.torch import load_file

    unet_dir = release / "unet"
    config = json.loads((unet_dir / "config.json").read_text())
    unet = _nemo_unet(model)
    counted = _count(
        unet, load_file(str(unet_dir / "diffusion_pytorch_model.safetensors")), Layout.of(config)
    )
    total = len(unet.state_dict())
    inputs = _inputs(config)
    ours = _nemo_output(unet, inputs, config)
    del unet  # one UNet in memory at a time: SDXL's is 10 GB in fp32
    gc.collect()
    if counted["not_filled"] or counted["not_used"]:
        found = "; ".join(
            f"{len(keys)} {name.replace('_', ' ')} (e.g. {keys[0]})" for name, keys in counted.items() if keys
        )
        raise WeightsCheckError(
            f"training.weights={release}: NeMo's UNet does not hold the released UNet: of its {total} tensors, "
            f"{found}; NeMo would train those from random weights. Likely fault: {_fault(model, config)}"
        )
    reference = _diffusers_output(unet_dir, inputs)
    difference, scale = float((ours - reference).abs().max()), float(reference.abs().max())
    if difference > TOLERANCE * max(scale, 1.0):
        raise WeightsCheckError(
            f"training.weights={release}: NeMo's UNet with the released weights and diffusers' own give outputs "
            f"{difference:.3g} apart (max |output| {scale:.3g}; allowed {TOLERANCE:g} relative): every tensor is "
            f"filled, so two are swapped or the blocks differ. Likely fault: {_fault(model, config)}"
        )
    return {
        "release": str(release),
        "tensors": total,
        "filled": total,
        "max_difference": difference,
        "scale": scale,
    }
