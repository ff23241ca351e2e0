"""A samplable copy of an SDXL .nemo trained from cached text embeddings (data_prep/text_cache.py).

Training from the cache (NeMo's `precache_mode: text`) replaces each caption embedder of
`conditioner_config.emb_models` by NeMo's PrecachedEmbModel, which reads stored embeddings and has no
weights; the .nemo sd_xl_train.py saves at the end holds that conditioner and no text-encoder tensors.
NeMo's sd_xl_infer.py cannot draw from it: its prompts never reach a text encoder. The encoders are frozen
(GeneralConditioner, is_trainable false) and the assets job stages their weights where the unswitched
config's `version` paths point, so training never changed them and inference can have them back.

What NeMo (2.4.1, the SDXL files as in the container's 2.0.0) does when sd_xl_infer.py restores a .nemo,
and so what the copy must hold:
- parts/utils.py `setup_trainer_and_model_for_inference` reads the stored model_config.yaml, applies the
  script's model_cfg_modifier (precision, ckpt_path, inductor, the VAE's target: never the conditioner),
  then `MegatronDiffusionEngine.restore_from(..., strict=True)`. The config is therefore the .nemo's own.
- The load is strict: NLPSaveRestoreConnector.restore_from -> load_instance_with_state_dict ->
  NLPAdapterModelMixin.load_state_dict (strict=True unless PEFT is set up) -> NLPModel.load_state_dict,
  which retries non-strict only to forgive missing `_extra_state` keys and raises otherwise. A conditioner
  with CLIP and OpenCLIP and a weights file without their tensors fails, so the copy carries them: the
  state dict of NeMo's own embedder built from the unswitched entry (the staged weights, as training's
  encode step built it), under `model.conditioner.embedders.<position>.` (MegatronDiffusionEngine.model
  -> DiffusionEngine.conditioner -> GeneralConditioner.embedders, an nn.ModuleList in config order).
- `precache_mode` (diffusion_engine.py) only picks the training data loader (text) or skips the VAE
  (both); it is removed, so that the copy reads as what it is: a model that takes prompts.

The unswitched entries come from the config the encode step read (`<training config stem>_encode.yaml`,
launcher/stages/precache.py `encode_config_file`): a PrecachedEmbModel entry keeps only its stored keys,
not which encoder wrote them. They are checked against the .nemo: switched again with
data_prep.text_cache.cached_conditioner they must give the .nemo's entries (the `device` aside: where the
tensors go, not what they are).

The family's `cache.restore` (RESTORE, a CacheRestore): the samples job asks it whether a .nemo needs the copy
and writes it (in NeMo's interpreter: torch, hydra and NeMo imported lazily; importing this needs omegaconf),
the samples stage checks before submission that the copy can be made (pure).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from launcher.checkpoints import nemo_model_config
from launcher.families.family import CacheRestore
from launcher.plugins.sdxl import text_cache
from launcher.sampling.nemo_archive import rewritten

# Where GeneralConditioner's embedder i sits in MegatronDiffusionEngine's state dict.
EMBEDDER_PREFIX = "model.conditioner.embedders.{}."


class TextEncodersError(ValueError):
    """The .nemo and the unswitched conditioner do not belong together, or the .nemo is not one to fix."""


def trained_on_cached_text(model_config: Mapping[str, Any]) -> bool:
    """Whether a .nemo's model config was trained from cached text embeddings (NeMo's precache_mode text)."""
    return model_config.get("precache_mode") == text_cache.PRECACHE_MODE


def unswitched_conditioner(config: Path) -> list[dict[str, Any]]:
    """`model.conditioner_config.emb_models` of a training config before the switch (the encode step's
    `<stem>_encode.yaml`), resolved, as plain containers."""
    from omegaconf import OmegaConf

    entries = OmegaConf.select(OmegaConf.load(config), "model.conditioner_config.emb_models")
    if entries is None:
        raise TextEncodersError(f"{config} has no model.conditioner_config.emb_models")
    return OmegaConf.to_container(entries, resolve=True)  # type: ignore[return-value]


def _placement_free(entry: Any) -> Any:
    """An emb_models entry without its emb_model's `device` (where tensors go, not what they are)."""
    if not isinstance(entry, Mapping) or not isinstance(entry.get("emb_model"), Mapping):
        return entry
    emb = {k: v for k, v in entry["emb_model"].items() if k != "device"}
    return {**entry, "emb_model": emb}


def restored_config(stored: Mapping[str, Any], unswitched: list[dict[str, Any]]) -> tuple[dict, list[int]]:
    """The .nemo's model config with its caption embedders back (and precache_mode removed), and their
    positions in emb_models. Refuses an unswitched conditioner that does not switch to the stored one."""
    if not trained_on_cached_text(stored):
        raise TextEncodersError(
            f"precache_mode is {stored.get('precache_mode')!r}, not {text_cache.PRECACHE_MODE!r}: "
            "the model was not trained from cached text embeddings and needs no restore"
        )
    have = list((stored.get("conditioner_config") or {}).get("emb_models") or [])
    unswitched_model = {"conditioner_config": {"emb_models": unswitched}}
    want = text_cache.cached_conditioner(unswitched_model)
    differ = [
        i
        for i in range(max(len(want), len(have)))
        if i >= min(len(want), len(have)) or _placement_free(want[i]) != _placement_free(have[i])
    ]
    if differ:
        i = differ[0]
        raise TextEncodersError(
            f"the unswitched conditioner does not give the .nemo's: emb_models.{i} switched to cached "
            f"text is {want[i] if i < len(want) else None}, the .nemo's {have[i] if i < len(have) else None}"
        )
    positions = sorted(text_cache.caption_keys(unswitched_model))
    emb_models = [unswitched[i] if i in positions else entry for i, entry in enumerate(have)]
    config = {k: v for k, v in stored.items() if k != "precache_mode"}
    config["conditioner_config"] = {**stored["conditioner_config"], "emb_models": emb_models}
    return config, positions


def encoder_tensors(emb_models: list[dict[str, Any]], positions: list[int]) -> dict[str, Any]:
    """The state dict of NeMo's own embedder at each position (built from its entry, with the weights
    its `version` names), under the keys MegatronDiffusionEngine gives them."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    tensors: dict[str, Any] = {}
    for position in positions:
        # NeMo's CLIP / OpenCLIP embedders build on the CPU; `device` only says where tokens go later.
        embedder = instantiate(OmegaConf.create(emb_models[position]["emb_model"]))
        tensors.update(embedder.state_dict(prefix=EMBEDDER_PREFIX.format(position)))
        del embedder
    return tensors


def restore_text_encoders(nemo: Path, unswitched: list[dict[str, Any]], out: Path) -> Path:
    """Write `out`, a copy of `nemo` that NeMo's sd_xl_infer.py draws from with prompts: its config's
    caption embedders are the unswitched ones (precache_mode removed) and its weights hold their tensors
    besides the trained ones (unchanged). Every other member is copied as is (nemo_archive.rewritten).
    Returns `out`."""
    from omegaconf import OmegaConf

    stored = OmegaConf.to_container(OmegaConf.create(nemo_model_config(nemo)))
    assert isinstance(stored, dict)
    config, positions = restored_config(stored, unswitched)

    def with_encoders(state: dict[str, Any]) -> dict[str, Any]:
        added = encoder_tensors(config["conditioner_config"]["emb_models"], positions)
        clash = sorted(set(state) & set(added))
        if clash:
            raise TextEncodersError(f"{nemo} already holds text-encoder tensors, e.g. {clash[0]}")
        return {**state, **added}

    return rewritten(nemo, out, config, with_encoders)


def check(stored: Mapping[str, Any], unswitched_training: Mapping[str, Any]) -> None:
    """Raises TextEncodersError unless the caption embedders of the training config before the switch
    switch to the .nemo's own (restored_config)."""
    restored_config(stored, unswitched_training["model"]["conditioner_config"]["emb_models"])


def write(nemo: Path, unswitched_config: Path, out: Path) -> None:
    restore_text_encoders(nemo, unswitched_conditioner(unswitched_config), out)


RESTORE = CacheRestore(needed=trained_on_cached_text, check=check, write=write)
