"""The export's NeMo side: a training checkpoint in the original single-file layout, and the modules NeMo's own
classes build from the training config, holding the checkpoint's weights, that the export is checked against.

The checkpoint's state dict is the LightningModule's: the UNet under `model.model.diffusion_model.` (NeMo's
names: data_prep.unet_names maps them to the original ones), the VAE under `model.first_stage_model.` and each
caption embedder under `model.<its module>.` (Family.diffusers.text_module), whose names below it are already
the original ones: NeMo's AutoencoderKL is CompVis's (`encoder.down.0.block.0...`, `mid.attn_1.q`), and its
FrozenCLIPEmbedder / FrozenOpenCLIPEmbedder(2) hold the same transformers CLIPTextModel (`transformer.`) or
open_clip model (`model.`, its visual tower deleted) as CompVis's and Stability's embedders. Runs in NeMo's
interpreter (torch, NeMo and hydra imported lazily).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data_prep.unet_names import nemo_to_original
from launcher.families.family import ExportedText, Family

UNET = "model.model.diffusion_model."
VAE = "model.first_stage_model."
ORIGINAL_UNET = "model.diffusion_model."
ORIGINAL_VAE = "first_stage_model."
# NeMo's PEFT adapters (sdlora: ParallelLinearAdapter on each attention projection).
ADAPTER = ".adapter_layer."


class ExportError(Exception):
    """What cannot be exported, or what differs: one line naming it."""


@dataclass(frozen=True)
class TextPart:
    """One caption embedder: its key under `model`, its config, how it is exported, its prefix in the state."""

    key: str
    section: Any
    exported: ExportedText
    prefix: str


def load_state(checkpoint: Path) -> dict[str, Any]:
    """The checkpoint's state dict, memory-mapped (Lightning stores OmegaConf objects: not weights_only)."""
    import torch

    return torch.load(checkpoint, map_location="cpu", mmap=True, weights_only=False)["state_dict"]


def under(state: dict[str, Any], prefix: str) -> dict[str, Any]:
    return {key[len(prefix) :]: value for key, value in state.items() if key.startswith(prefix)}


def text_parts(model: Any, family: Family) -> list[TextPart]:
    """The caption embedders of the config, each with how the family exports it (same order)."""
    diffusers = family.diffusers
    assert diffusers is not None
    found = family.text_encoders(model)
    if len(found) != len(diffusers.exported_text):
        keys = ", ".join(key for key, _ in found) or "none"
        raise ExportError(
            f"the config's caption embedders ({keys}) are not the {len(diffusers.exported_text)} text encoders "
            f"of {diffusers.pipeline} (a model trained from cached text embeddings holds none)"
        )
    return [
        TextPart(key, section, exported, f"model.{diffusers.text_module(key)}.")
        for (key, section), exported in zip(found, diffusers.exported_text, strict=True)
    ]


def single_file(state: dict[str, Any], model: Any, family: Family) -> dict[str, Any]:
    """The checkpoint's weights under the original single-file names (UNet, VAE, text encoders)."""
    adapters = [key for key in state if ADAPTER in key]
    if adapters:
        raise ExportError(f"the checkpoint holds LoRA adapters ({adapters[0]}): not exported here yet")
    unet = under(state, UNET)
    if not unet:
        raise ExportError(f"the checkpoint holds no {UNET}* tensors: not a NeMo Stable Diffusion checkpoint")
    out = {ORIGINAL_UNET + nemo_to_original(key): value for key, value in unet.items()}
    out.update({ORIGINAL_VAE + key: value for key, value in under(state, VAE).items()})
    for part in text_parts(model, family):
        weights = under(state, part.prefix)
        if not weights:
            raise ExportError(f"the checkpoint holds no {part.prefix}* tensors (model.{part.key})")
        out.update({part.exported.original + key: value for key, value in weights.items()})
    return out


def _section(section: Any, **changes: Any) -> Any:
    from omegaconf import OmegaConf

    plain = OmegaConf.to_container(OmegaConf.create(section), resolve=True)
    assert isinstance(plain, dict)
    return OmegaConf.create({**plain, **changes})


def _loaded(module: Any, weights: dict[str, Any], what: str, dtype: Any) -> Any:
    """`module` with `weights` loaded strictly, rounded to the export's dtype and computed in fp32: what the
    exported files hold, as NeMo computes it."""
    import torch

    missing, unexpected = module.load_state_dict(weights, strict=False)
    if missing or unexpected:
        first = (missing or unexpected)[0]
        raise ExportError(
            f"{what}: the checkpoint does not fit NeMo's module ({first}: missing or unexpected)"
        )
    return module.to(dtype).to(torch.float32).eval()


def instantiate(section: Any, what: str, **changes: Any) -> Any:
    from hydra.utils import instantiate as build

    try:
        return build(_section(section, **changes))
    except Exception as error:  # hydra wraps the constructor's error; its text names what failed
        raise ExportError(f"{what}: NeMo cannot build it: {error}".replace("\n", " ")) from None


def unet(model: Any, state: dict[str, Any], dtype: Any) -> Any:
    """NeMo's UNetModel of the config, with the checkpoint's UNet (torch attention: the same weights)."""
    import data_prep.nemo_compat  # noqa: F401  (apex GroupNorm absent off NVIDIA's container)

    built = instantiate(
        model["unet_config"], "model.unet_config", from_pretrained=None, use_flash_attention=False
    )
    return _loaded(built, under(state, UNET), "model.unet_config", dtype)


def vae(model: Any, state: dict[str, Any], dtype: Any) -> Any:
    import data_prep.nemo_compat  # noqa: F401

    built = instantiate(model["first_stage_config"], "model.first_stage_config", from_pretrained=None)
    return _loaded(built, under(state, VAE), "model.first_stage_config", dtype)


def embedder(part: TextPart, state: dict[str, Any], dtype: Any) -> Any:
    """The caption embedder NeMo trained with (its tokenizer and architecture from its staged `version`),
    holding the checkpoint's weights."""
    built = instantiate(part.section, f"model.{part.key}", device="cpu")
    return _loaded(built, under(state, part.prefix), f"model.{part.key}", dtype)


def time_embedders(model: Any, family: Family) -> list[tuple[str, Any]]:
    """(input key, NeMo's embedder) of each conditioner input the family's `time_ids` name, in the config's
    order: what follows the pooled text in NeMo's `y`."""
    assert family.diffusers is not None
    wanted = family.diffusers.time_ids
    conditioner = model.get("conditioner_config") or {}  # NeMo's GeneralConditioner
    return [
        (
            entry["input_key"],
            instantiate(
                entry["emb_model"], f"model.conditioner_config.emb_models.{index}.emb_model", device="cpu"
            ),
        )
        for index, entry in enumerate(conditioner.get("emb_models") or [])
        if entry.get("input_key") in wanted
    ]
