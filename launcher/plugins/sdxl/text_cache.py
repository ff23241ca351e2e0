"""SDXL's cached text embeddings, in the form NeMo v2.4's `precache_mode: text` reads.

NeMo (diffusion_engine.py `build_train_valid_test_datasets` -> stable_diffusion_dataset.py
`build_sdxl_precached_text_train_valid_datasets`) reads per sample a `png` member, decoded by
webdataset.py `pil_loader` (PIL opens it by its content; the name only selects the member), and a `pickle`
member whose dict it merges into the batch (`out_dict.update(...)`); it sets `captions` to 'fake caption'
and computes the size/crop conditioning from the image exactly as from the image tars. The model then
needs, in `conditioner_config`, embedders that read the stored keys instead of the captions: NeMo's
`PrecachedEmbModel` passes its `input_keys` through. NeMo ships no config and no writer for this mode;
this module is both halves:

- `cached_conditioner` replaces each embedder that reads `captions` by a PrecachedEmbModel on that
  embedder's stored outputs (`caption_keys`), keeping its position, `ucg_rate` and trainability. NeMo's
  GeneralConditioner draws one caption-dropout mask per output tensor and concatenates the outputs in
  embedder order, so the conditioning it builds (cross-attention [80, CLIP + OpenCLIP width], vector
  [pooled width + 3 x 512]) has the same layout, the same dropout and the same random draws as from the
  captions. The size/crop embedders stay as they are.
- `TextEncoder` runs the configured caption embedders themselves (NeMo's FrozenCLIPEmbedder and
  FrozenOpenCLIPEmbedder2 with the staged weights) on the captions, under the autocast training uses, and
  stores every output tensor under its key.

The `png` member holds the image tar's image bytes unchanged (a JPEG): PIL decodes the same pixels as from
the `jpg` member, so training sees the same images at the same sizes, with no re-encoding and no loss.
Stored dtype: float16 when training runs under mixed precision (the tensors enter the UNet under its
autocast, as latent_format argues for SD), float32 for `precision: 32` (no autocast would cast them).
"""

from __future__ import annotations

from typing import Any

# The batch key NeMo's SDXL loader yields the caption under (stable_diffusion_dataset.py
# build_sdxl_train_valid_datasets): the conditioner's embedders of that key are its text encoders.
CAPTIONS = "captions"
PRECACHE_MODE = "text"
PRECACHED = "nemo.collections.multimodal.modules.stable_diffusion.encoders.modules.PrecachedEmbModel"
MEMBERS = ("pickle", "png")  # pickle first: a tar's first member says "cached" (launcher.preflight)
MIXED = {"bf16", "bf16-mixed", "16", "16-mixed"}
TOKENS, TOKEN_PAD = 77, 8  # both NeMo embedders tokenize to 77 and pad their output to a multiple of 8


def conditioner_embedders(model: Any) -> list[tuple[str, Any]]:
    """(key under `model`, entry) of each of a conditioner's emb_models, in NeMo's order."""
    entries = (model.get("conditioner_config") or {}).get("emb_models") or []
    return [(f"conditioner_config.emb_models.{index}", entry) for index, entry in enumerate(entries)]


def _entries(model: Any) -> list[Any]:
    return [entry for _, entry in conditioner_embedders(model)]


def _outputs(emb_model: Any) -> int:
    """Tensors a caption embedder returns: NeMo's CLIP and OpenCLIP embedders add the pooled one when
    `always_return_pooled` is set."""
    return 2 if emb_model.get("always_return_pooled") else 1


def caption_keys(model: Any) -> dict[int, tuple[str, ...]]:
    """{position in conditioner_config.emb_models: the stored keys of its outputs} for every embedder
    that reads the captions."""
    return {
        index: tuple(f"caption_emb_{index}_{n}" for n in range(_outputs(entry.get("emb_model") or {})))
        for index, entry in enumerate(_entries(model))
        if entry.get("input_key") == CAPTIONS
    }


def cached_conditioner(model: Any) -> list[dict[str, Any]]:
    """`conditioner_config.emb_models` for training from the cache (plain containers)."""
    from omegaconf import OmegaConf

    keys = caption_keys(model)
    out = []
    for index, entry in enumerate(_entries(model)):
        plain = OmegaConf.to_container(entry, resolve=True) if OmegaConf.is_config(entry) else dict(entry)
        assert isinstance(plain, dict)
        if index in keys:
            emb = {"_target_": PRECACHED}
            if "device" in plain["emb_model"]:  # PrecachedEmbModel moves its tensors to CUDA unless told
                emb["device"] = plain["emb_model"]["device"]
            plain = {
                "is_trainable": plain.get("is_trainable", False),
                "ucg_rate": plain.get("ucg_rate", 0.0),
                "input_keys": list(keys[index]),
                "emb_model": emb,
            }
        out.append(plain)
    return out


def stored_dtype(model: Any) -> str:
    return "<f2" if str(model.get("precision")) in MIXED else "<f4"


def stored_values(model: Any) -> int:
    """Numbers stored per sample, from the UNet's sizes (no weights read): the cross-attention context
    (both towers' 77 tokens padded to 80, CLIP + OpenCLIP width = unet_config.context_dim) and the pooled
    embedding (unet_config.adm_in_channels less the size/crop embedders' part: 2 numbers x outdim each)."""
    unet = model.get("unet_config") or {}
    sizes = sum(
        2 * int((entry.get("emb_model") or {}).get("outdim", 0))
        for entry in _entries(model)
        if entry.get("input_key") != CAPTIONS
    )
    tokens = (TOKENS + TOKEN_PAD - 1) // TOKEN_PAD * TOKEN_PAD
    return tokens * int(unet.get("context_dim", 0)) + int(unet.get("adm_in_channels", 0)) - sizes


class TextEncoder:
    """NeMo's own caption embedders from the training config, as the encode step drives them
    (data_prep.family_settings.Encoder)."""

    @staticmethod
    def depends_on(model: Any) -> dict[str, Any]:
        """The conditioner and the precision: the VAE, the resolution and the crops do not enter the cache."""
        from data_prep.latent_encoder import config_values

        return config_values(model, ("conditioner_config", "precision"))

    def __init__(self, model: Any, device: str) -> None:
        import torch
        from hydra.utils import instantiate
        from nemo.collections.multimodal.data.common.webdataset import pil_loader
        from omegaconf import OmegaConf

        from data_prep.latent_encoder import autocast, frozen

        self.keys = caption_keys(model)
        self.device = torch.device(device)
        self.embedders = []
        for index in self.keys:
            config = OmegaConf.create(OmegaConf.to_container(_entries(model)[index].emb_model, resolve=True))
            config.device = (
                device  # NeMo's CLIP and OpenCLIP embedders move their tokens there (default cuda)
            )
            self.embedders.append(frozen(instantiate(config)).to(self.device))
        self.autocast = autocast(model, self.device)
        self.dtype = stored_dtype(model)
        self._load = pil_loader

    def preprocess(self, jpg: bytes) -> bytes:
        """The image bytes, once NeMo's loader has shown it can decode them (it skips those it cannot)."""
        self._load("sample.png", jpg)
        return jpg

    def embed(self, captions: list[str]) -> list[dict[str, Any]]:
        """Per caption, {stored key: float32 array} of every caption embedder's outputs."""
        import torch

        out: list[dict[str, Any]] = [{} for _ in captions]
        with torch.no_grad(), self.autocast():
            for keys, embedder in zip(self.keys.values(), self.embedders, strict=True):
                tensors = embedder.encode(list(captions))
                tensors = tensors if isinstance(tensors, (list, tuple)) else [tensors]
                for key, tensor in zip(keys, tensors, strict=True):
                    for sample, row in zip(out, tensor.float().cpu().numpy(), strict=True):
                        sample[key] = row
        return out

    def encode_members(self, images: list[bytes], captions: list[str]) -> list[list[tuple[str, bytes]]]:
        import numpy as np

        from data_prep.latent_format import EncodeError, dumps_arrays

        embedded = self.embed(captions)
        for caption, arrays in zip(captions, embedded, strict=True):
            for key, array in arrays.items():  # float16 holds |x| < 65504: say so rather than store inf
                if not np.isfinite(array.astype(self.dtype)).all():
                    raise EncodeError(f"{key} of caption {caption[:60]!r} does not fit {self.dtype}")
        return [
            [(MEMBERS[0], dumps_arrays(arrays, self.dtype)), (MEMBERS[1], image)]
            for image, arrays in zip(images, embedded, strict=True)
        ]
