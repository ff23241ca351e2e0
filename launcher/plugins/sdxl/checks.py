"""What the launcher refuses in an SDXL training config (NeMo's MegatronDiffusionEngine, sd_xl_train.py)
before anything is submitted: the SDXL family's `check` (launcher.nemo_config asks the family) and
`check_cache` (the cached text embeddings' settings, launcher.latents asks).

- The image augmentations: NeMo's SDXL loader (stable_diffusion_dataset.py build_sdxl_train_valid_datasets)
  computes the size/crop conditioning from the image after `resize_smallest_side` and crops it square;
  with a `center_crop_h_w` key it yields no size/crop keys and the size embedders fail with a KeyError.
- `precache_mode`: set by data_preparation.precache.enable (launcher.latents), never by hand.
- `data.synthetic_data`: SD's random-tensor mode; NeMo's SDXL engine ignores it and reads the tars.
- The widths: the conditioner concatenates its embedders' outputs, so the UNet's `context_dim` must be the
  sum of the text encoders' widths and `adm_in_channels` the sum of the vector outputs (pooled text and 2 x
  outdim per size/crop embedder). Checked only where the config names the widths: an open_clip arch or a
  CLIP model (by its Hub repo, or the staged asset whose folder it reads) in the tables below.
"""

from __future__ import annotations

from typing import Any

from launcher.errors import ConfigError
from launcher.families.family import CACHE_SWITCH
from launcher.plugins.sdxl import text_cache

MODEL = "training.model"
AUG = f"{MODEL}.data.train.augmentations"
# open_clip's text tower of an arch: (width of each token's output, pooled width = embed_dim), from
# open_clip's model_configs/<arch>.json (text_cfg.width, embed_dim); tests/test_sdxl_config.py compares.
OPEN_CLIP_TEXT = {"ViT-bigG-14": (1280, 1280), "ViT-H-14": (1024, 1024), "ViT-L-14": (768, 768)}
# A CLIP text model's hidden size (its config.json), by Hub repo.
CLIP_TEXT = {"openai/clip-vit-large-patch14": 768}


def _kind(emb_model: Any) -> str:
    return str(emb_model.get("_target_", "")).rsplit(".", 1)[-1]


def _clip_repo(version: str, assets: Any) -> str:
    """The Hub repo a FrozenCLIPEmbedder reads: its version, or the staged asset whose folder it is."""
    for asset in vars(assets).values():
        if getattr(asset, "local_dir", None) == version:
            return str(asset.repo_id)
    return version


def _widths(emb_model: Any, assets: Any) -> tuple[int | None, int | None]:
    """(token output width, pooled width) of one embedder; None where the config does not say; (0, 0)
    for an output it does not give."""
    kind = _kind(emb_model)
    if kind == "FrozenOpenCLIPEmbedder2":
        width, pooled = OPEN_CLIP_TEXT.get(str(emb_model.get("arch", "ViT-H-14")), (None, None))
        return width, pooled if emb_model.get("always_return_pooled") else 0
    if kind == "FrozenCLIPEmbedder":
        width = CLIP_TEXT.get(_clip_repo(str(emb_model.get("version")), assets))
        return width, width if emb_model.get("always_return_pooled") else 0
    if kind == "ConcatTimestepEmbedderND":  # each size/crop key holds two numbers
        return 0, 2 * int(emb_model.get("outdim", 0))
    return None, None


def _check_sizes(model: Any, assets: Any) -> None:
    widths = [
        _widths(entry.get("emb_model") or {}, assets) for _, entry in text_cache.conditioner_embedders(model)
    ]
    unet = model.get("unet_config") or {}
    for index, name, what in (
        (0, "context_dim", "the text encoders' widths (cross-attention)"),
        (1, "adm_in_channels", "the pooled text width + 2 x outdim of each size/crop embedder (vector)"),
    ):
        parts = [pair[index] for pair in widths]
        if None in parts or unet.get(name) is None:
            continue  # a width the config does not name: NeMo's first step is the judge
        if int(unet[name]) != sum(parts):
            raise ConfigError(
                f"{MODEL}.unet_config.{name}",
                f"{unet[name]} but the conditioner gives {' + '.join(map(str, filter(None, parts)))} = "
                f"{sum(parts)}: {what}; NeMo would fail at the first step. Allowed: {sum(parts)}",
            )


def _check_augmentations(model: Any) -> None:
    augmentations = ((model.get("data") or {}).get("train") or {}).get("augmentations")
    if not augmentations or not augmentations.get("resize_smallest_side"):
        raise ConfigError(
            f"{AUG}.resize_smallest_side",
            "is not set: NeMo's SDXL loader resizes the smaller side to it, then crops a square and computes "
            "the size/crop conditioning from it. Allowed: the training resolution in px, e.g. 256",
        )
    if "center_crop_h_w" in augmentations:
        raise ConfigError(
            f"{AUG}.center_crop_h_w",
            "is set: with it NeMo's SDXL loader yields no original_size_as_tuple / crop_coords_top_left / "
            "target_size_as_tuple, and the conditioner's size embedders fail with a KeyError. Allowed: no "
            f"such key (~{AUG}.center_crop_h_w); the loader crops a square of resize_smallest_side itself",
        )


def check(cfg: Any) -> None:
    """Every refusal of an SDXL training config's `model` section (the staged assets name its widths)."""
    model, assets = cfg.training.model, cfg.assets
    if (model.get("data") or {}).get("synthetic_data"):
        raise ConfigError(
            f"{MODEL}.data.synthetic_data",
            "is true, but NeMo's SDXL training has no synthetic data: MegatronDiffusionEngine builds its "
            "webdataset loader whatever the key says. Allowed: false (for the sweep: benchmark.synthetic_data=false)",
        )
    if model.get("precache_mode") is not None:
        raise ConfigError(
            f"{MODEL}.precache_mode",
            f"{model.get('precache_mode')!r}: data_preparation.precache.enable sets it (text: the cached text "
            "embeddings it writes; NeMo's 'both' drops the size/crop conditioning, docs/latents.md). Allowed: null",
        )
    _check_augmentations(model)
    _check_sizes(model, assets)


def check_cache(cfg: Any, enabled: bool) -> None:
    """SDXL caches the caption embedders' outputs only (NeMo's precache_mode text): the images, their
    augmentations and the size/crop conditioning stay as they are (precache_mode set by hand is refused
    by `check`)."""
    if not enabled:
        return
    model = cfg.training.model
    keys = text_cache.caption_keys(model)
    if not keys:
        raise ConfigError(
            "training.model.conditioner_config.emb_models",
            f"no embedder reads {text_cache.CAPTIONS!r}: there is no text to cache. Allowed: the preset's "
            f"conditioner, or {CACHE_SWITCH}=false",
        )
    entries = model.get("conditioner_config", {}).get("emb_models")
    for index in keys:
        if entries[index].get("legacy_ucg_value") is not None:
            raise ConfigError(
                f"training.model.conditioner_config.emb_models.{index}.legacy_ucg_value",
                "replaces captions in the batch, which training from cached text embeddings does not "
                f"read. Allowed: null (ucg_rate drops the embedding instead), or {CACHE_SWITCH}=false",
            )
    if (model.get("data", {}).get("train", {}) or {}).get("filterings"):
        raise ConfigError(
            "training.model.data.train.filterings",
            "NeMo's cached-text loader filters on a 'jpg' member its tars do not have (it reads 'png'). "
            f"Allowed with {CACHE_SWITCH}=true: null",
        )
