"""Which of NeMo's two diffusion families a training config's `model` section describes, and where its
text encoders sit.

SD 1.x/2.0 is NeMo's MegatronLatentDiffusion (`sd_train.py`; text encoder in `cond_stage_config`);
SDXL is NeMo's MegatronDiffusionEngine (`sd_xl_train.py`), whose text encoders and size/crop embedders
sit in `conditioner_config` (diffusion_engine.py reads `cfg.conditioner_config`; SD's model never does).
Works on a DictConfig or a plain dict (both have .get).

>>> is_sdxl({"conditioner_config": {"emb_models": []}}), is_sdxl({"cond_stage_config": {}})
(True, False)
>>> sdxl = {"conditioner_config": {"emb_models": [
...     {"input_key": "captions", "emb_model": {"version": "/clip"}},
...     {"input_key": "original_size_as_tuple", "emb_model": {"outdim": 256}}]}}
>>> text_encoders(sdxl), text_encoders({"cond_stage_config": {"version": "/clip"}})
([('conditioner_config.emb_models.0.emb_model', {'version': '/clip'})], [('cond_stage_config', {'version': '/clip'})])
"""

from __future__ import annotations

from typing import Any

# The batch key NeMo's SDXL loader yields the caption under (stable_diffusion_dataset.py
# build_sdxl_train_valid_datasets): the conditioner's embedders of that key are its text encoders.
SDXL_TEXT_KEY = "captions"


def is_sdxl(model: Any) -> bool:
    """The config is an SDXL one (NeMo's MegatronDiffusionEngine)."""
    return bool(model.get("conditioner_config"))


def sdxl_embedders(model: Any) -> list[tuple[str, Any]]:
    """(key under `model`, entry) of each of an SDXL conditioner's emb_models, in NeMo's order."""
    entries = (model.get("conditioner_config") or {}).get("emb_models") or []
    return [(f"conditioner_config.emb_models.{index}", entry) for index, entry in enumerate(entries)]


def text_encoders(model: Any) -> list[tuple[str, Any]]:
    """(key under `model`, config) of each text encoder NeMo builds from the config: SD's
    cond_stage_config, or each SDXL embedder of the captions."""
    if not is_sdxl(model):
        cond = model.get("cond_stage_config")
        return [("cond_stage_config", cond)] if cond else []
    return [
        (f"{key}.emb_model", entry.get("emb_model") or {})
        for key, entry in sdxl_embedders(model)
        if entry.get("input_key") == SDXL_TEXT_KEY
    ]
