"""Cached latents: the one switch (`data_preparation.precache.enable`) and everything it changes in
training, asked by nemo_config, preflight, the stages and the launch. Imports no stage module.

On (and the data real), training and data_check read the latent tars that data preparation's
encode_latents writes (launcher/stages/precache.py plans those jobs): `training_overrides` gives the keys
and paths the switch sets in NeMo's config, `training_wdinfo` the wdinfo training reads. Off, training
reads the image tars. What is cached, what the switch sets in NeMo's config and what is refused is the
trained family's (launcher.families, its `cache`): SD's VAE latents and text, SDXL's text embeddings
only (NeMo's `precache_mode: text`, launcher.plugins.sdxl.text_cache).

`check` refuses, before anything is submitted, every config the encode step or NeMo's precached loader
could not serve (the family's `cache.check`).
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from launcher.families import family_of
from launcher.families.family import CACHE_SWITCH
from launcher.layout import DataLayout

SWITCH = CACHE_SWITCH


def enabled(cfg: Any) -> bool:
    """Training reads latents: the switch is on and the data is real (synthetic data has no tars)."""
    synthetic = cfg.training.model.get("data", {}).get("synthetic_data")
    own_source = not family_of(cfg.training.model).reads_prepared_data  # no tars at all
    return bool(cfg.data_preparation.precache.enable) and not synthetic and not own_source


def training_overrides(cfg: Any, layout: DataLayout) -> dict[str, Any]:
    """What the switch sets in NeMo's training config (nothing when off): the family's keys (SD's latent
    keys; SDXL's `precache_mode: text` and a conditioner whose caption embedders read the cache) and the
    cached tars' paths."""
    if not enabled(cfg):
        return {}
    return {
        **family_of(cfg.training.model).cache.overrides(cfg.training.model),
        "data": {
            "train": {"dataset_path": [str(layout.latent_wdinfo)]},
            "webdataset": {"local_root_path": str(layout.latent_tar_dir)},
        },
    }


def training_wdinfo(cfg: Any) -> PurePosixPath:
    """The wdinfo training reads: the latent tars' with the switch on, else the image tars'."""
    layout = DataLayout(PurePosixPath(cfg.data_dir))
    return layout.latent_wdinfo if enabled(cfg) else layout.wdinfo


def check(cfg: Any) -> None:
    """Every refusal of the switch's settings, by the trained family (launcher.families: its `cache`)."""
    family_of(cfg.training.model).cache.check(cfg, enabled(cfg))
