"""What the data programs need of a training config's model family, decided at planning time and written
beside the config (`<config stem>.family.json`).

How NeMo's loader reads a config's data (its dataset builder, the batch keys, the keys it needs) and what
the cached inputs store differ by the model's family. The planner asks the family (launcher.families:
`Family.settings_for`) and writes its answers for that one config here; data_check and encode_latents
read them and never ask which family it is, so data_prep imports nothing of the launcher. Stdlib only.

    >>> settings_path(Path("/r/training/sd_860m_res_256.yaml"))
    PosixPath('/r/training/sd_860m_res_256.family.json')
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

SUFFIX = ".family.json"


class FamilySettingsError(Exception):
    """The settings beside a training config are missing or unreadable: the message names the file."""


@dataclass(frozen=True)
class FamilySettings:
    # The family's name (launcher.families): a job that finds another family for the config runs without
    # a plugin the planner had, and refuses.
    family: str
    # NeMo's module of the family's dataset builders, and the builder (called with the model config and
    # consumed_samples=0) this config's data take: from the image tars, or from the cached inputs.
    module: str
    builder: str
    # The config has training read the cached inputs (data_preparation.precache) rather than the image tars.
    reads_cache: bool
    # The batch keys the loader yields: the images' (or latents'), the captions' (or text embeddings'), then
    # any others the model reads.
    batch_keys: tuple[str, ...]
    # Keys under `model` the builders read besides data.* and micro_batch_size (refused when missing).
    model_keys: tuple[str, ...]
    # "module:Class" of the encode step's encoder of the family's cached inputs (the Encoder protocol below):
    # SD's stores the VAE's moments and the text encoder's output (data_prep.latent_encoder).
    encoder: str
    # "module:function" of data_check's check of the first cached batch NeMo's loader drew, (the loader's
    # report, the model config, the micro batch) -> errors (data_prep.latent_check's); None: none.
    batch_check: str | None
    # The key under `model` of each text encoder NeMo builds from the config.
    text_encoders: tuple[str, ...]
    # The members each sample of the image tars must have (<key>.jpg, <key>.txt, then any the family's loader
    # reads, such as ControlNet's <key>.png hint).
    members: tuple[str, ...]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2) + "\n"


class Encoder(Protocol):
    """What the encode step (data_prep.encode_latents) asks of a family's encoder, built as (the training
    config's `model`, the torch device)."""

    @staticmethod
    def depends_on(model: Any) -> dict[str, Any]:
        """What the cached inputs depend on besides the image tar: a rerun re-encodes a tar when it changes."""
        ...

    def preprocess(self, jpg: bytes) -> Any:
        """One sample's image bytes as `encode_members` takes it; raises where NeMo's loader cannot decode it."""
        ...

    def encode_members(self, images: list[Any], captions: list[str]) -> list[list[tuple[str, bytes]]]:
        """Per sample, the (member extension, bytes) of its cached sample, in the order they are written."""
        ...


def named(reference: str) -> Any:
    """The class or function the settings name as "module:NAME" (a family's own, found by its module)."""
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


def settings_path(config: Path) -> Path:
    return config.with_name(config.stem + SUFFIX)


def read_settings(config: Path) -> FamilySettings:
    """The settings the launcher wrote beside `config` (a NeMo training config it rendered)."""
    path = settings_path(config)
    try:
        raw = json.loads(path.read_text())
        return FamilySettings(
            **{
                **raw,
                "batch_keys": tuple(raw["batch_keys"]),
                "model_keys": tuple(raw["model_keys"]),
                "text_encoders": tuple(raw["text_encoders"]),
                "members": tuple(raw["members"]),
            }
        )
    except FileNotFoundError as error:
        raise FamilySettingsError(
            f"{path}: no such file; the launcher writes it beside the training config it renders "
            f"({config.name}): pass a config of a planned run"
        ) from error
    except (OSError, ValueError, TypeError, KeyError) as error:
        raise FamilySettingsError(f"{path}: not the family settings the launcher writes ({error})") from error
