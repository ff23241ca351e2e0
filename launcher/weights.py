"""training.weights: a model released in diffusers' layout that a training starts from whole, a Hub repo at a
pinned commit (`hf://<owner>/<name>[@<commit>]`) or a diffusers folder on shared storage.

NeMo reads from it the UNet, the VAE and each text encoder its own classes can read in that layout (the
family says which: Family.diffusers; NeMo's OpenCLIP embedders read only open_clip's format, so those keep
the family's pinned assets). The assets job stages it once, then every job reads it offline: a Hub repo's
files under `<assets.dir>/released/<owner>--<name>--<commit12>/`, and beside them in `nemo/` what NeMo reads
that the release does not hold as such: the VAE under the names NeMo's loader maps (data_prep/vae_names.py),
SDXL's UNet under NeMo's names (data_prep/unet_names.py), a folder with tokenizer and text model together
per text encoder. A local folder is read where it is; its `nemo/` files go under
`<assets.dir>/released/local--<name>--<hash12>/`.

Everything here is pure: the value's syntax says what it is, a release's diffusers configs are shipped with
its family (launcher/families/diffusers_configs/), and what the host holds is read by `host_check` only.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data_prep.unet_names import nemo_args
from launcher.errors import ConfigError
from launcher.families import family_of, names
from launcher.families.family import DIFFUSERS_CONFIGS, UNET_FILE, VAE_FILE, Family, Released
from launcher.unet_shape import unet_shape

KEY = "training.weights"
HUB = "hf://"
NEMO = "nemo"
UNET_CONFIG = "unet/config.json"
NEMO_UNET = f"{NEMO}/unet.safetensors"
NEMO_VAE = f"{NEMO}/vae.safetensors"
TEXT_MODEL_FILES = ("config.json", "model.safetensors")
TOKENIZER_FILES = ("vocab.json", "merges.txt", "special_tokens_map.json", "tokenizer_config.json")
BASE_FILES = (
    "model_index.json",
    "scheduler/scheduler_config.json",
    UNET_CONFIG,
    UNET_FILE,
    "vae/config.json",
    VAE_FILE,
)


@dataclass(frozen=True)
class Weights:
    """training.weights, parsed: a Hub repo (repo_id, revision) or a local folder."""

    family: Family
    repo_id: str | None = None
    revision: str | None = None
    folder: Path | None = None
    # The family's declaration of this repo (its shipped configs, licence), None for any other.
    released: Released | None = None

    @property
    def label(self) -> str:
        if self.folder is not None:
            return str(self.folder)
        return f"{HUB}{self.repo_id}@{self.revision}"

    def files(self) -> tuple[str, ...]:
        """The repo files that the training and the export read."""
        extra = [
            f"{folder}/{name}"
            for _, text, tokenizer in self.diffusers.text_encoders
            for folder, names_ in ((text, TEXT_MODEL_FILES), (tokenizer, TOKENIZER_FILES))
            for name in names_
        ]
        return (*BASE_FILES, *extra)

    @property
    def diffusers(self) -> Any:
        return self.family.diffusers


def given(cfg: Any) -> str | None:
    return cfg.training.weights


def of(cfg: Any) -> Weights | None:
    """training.weights of a validated config (its syntax checked by `check`), or None when unset."""
    value = given(cfg)
    if value is None:
        return None
    family = family_of(cfg.training.model)
    if not value.startswith(HUB):
        return Weights(family, folder=Path(value))
    repo_id, _, revision = value.removeprefix(HUB).partition("@")
    released = next((r for r in _released(family) if r.repo_id == repo_id), None)
    return Weights(family, repo_id, revision or (released.revision if released else None), None, released)


def _released(family: Family) -> tuple[Released, ...]:
    return family.diffusers.released if family.diffusers else ()


def staged_dir(cfg: Any, weights: Weights) -> Path:
    """Where the assets job stages them: the repo's files, and the `nemo/` files in either case."""
    root = Path(cfg.assets.dir) / "released"
    if weights.folder is not None:
        digest = hashlib.sha1(str(weights.folder).encode()).hexdigest()[:12]
        return root / f"local--{weights.folder.name}--{digest}"
    owner, name = str(weights.repo_id).split("/")
    return root / f"{owner}--{name}--{str(weights.revision)[:12]}"


def origin_dir(cfg: Any, weights: Weights) -> Path:
    """Where the release's own files are: the local folder, or the staged copy of the repo."""
    return weights.folder if weights.folder is not None else staged_dir(cfg, weights)


def nemo_overrides(cfg: Any) -> dict[str, Any]:
    """{dotted key under NeMo's `model`: value}: what NeMo reads from the staged weights (launcher.nemo_config
    sets them; a key may index a list, as SDXL's `conditioner_config.emb_models.0`)."""
    weights = of(cfg)
    if weights is None:
        return {}
    staged, origin = staged_dir(cfg, weights), origin_dir(cfg, weights)
    unet_file, from_nemo = (
        (staged / NEMO_UNET, True) if weights.diffusers.stages_unet else (origin / UNET_FILE, False)
    )
    overrides: dict[str, Any] = {
        "unet_config.from_pretrained": str(unet_file),
        "unet_config.from_NeMo": from_nemo,
        "first_stage_config.from_pretrained": str(staged / NEMO_VAE),
    }
    for key, text, _ in weights.diffusers.text_encoders:
        overrides[f"{key}.version"] = str(staged / NEMO / text)
    return overrides


def check(cfg: Any) -> None:
    """The value names a source the trained family can start from, one way, with a pinned commit; a release
    the family declares must have this preset's UNet (from its shipped config)."""
    value = given(cfg)
    if value is None:
        return
    family = family_of(cfg.training.model)
    if family.diffusers is None:
        raise ConfigError(KEY, f"{family.title} has no diffusers layout to start from; allowed: null")
    if cfg.training.init_from not in (None, "none"):
        raise ConfigError(
            KEY,
            f"is set and so is training.init_from ({cfg.training.init_from}); allowed: one of them "
            "(weights: a released model in diffusers' layout; init_from: an earlier run of this launcher)",
        )
    weights = of(cfg)
    assert weights is not None
    _check_withdrawn(weights)
    if weights.folder is None and weights.revision is None:
        known = ", ".join(f"{HUB}{r.repo_id}" for r in _released(family))
        raise ConfigError(
            KEY,
            f"{value!r} names no commit and {family.title} declares no such release; allowed: "
            f"{HUB}<owner>/<name>@<40-hex commit>, or one of {family.title}'s releases ({known})",
        )
    if weights.released is not None:
        check_unet(
            cfg, released_unet_config(weights.released), f"{weights.released.title}'s unet/config.json"
        )
        _check_parameterization(cfg, weights.released)
    elif weights.repo_id is not None:
        _check_other_family(cfg, weights)


def _check_withdrawn(weights: Weights) -> None:
    """A repo its authors withdrew from the Hub, refused naming the mirror a family declares instead."""
    from launcher.families import FAMILIES

    for family in FAMILIES:
        for release in _released(family):
            if weights.repo_id is not None and release.withdrawn == weights.repo_id:
                raise ConfigError(
                    KEY,
                    f"{weights.repo_id} was withdrawn from the Hub by its authors; allowed: {HUB}{release.repo_id} "
                    f"({release.title}: the same files, kept by a mirror)",
                )


def _check_other_family(cfg: Any, weights: Weights) -> None:
    """A release another family declares, named for this preset: refused naming both."""
    from launcher.families import FAMILIES

    for other in FAMILIES:
        for release in _released(other):
            if release.repo_id == weights.repo_id:
                raise ConfigError(
                    KEY,
                    f"{weights.repo_id} is {release.title} ({other.title}), but training={cfg.training.run.name} "
                    f"trains {weights.family.title}; allowed: a {other.title} training preset, or "
                    f"{', '.join(HUB + r.repo_id for r in _released(weights.family))}",
                )


def _check_parameterization(cfg: Any, released: Released) -> None:
    ours = cfg.training.model.get("parameterization", "eps")
    if ours != released.parameterization:
        raise ConfigError(
            "training.model.parameterization",
            f"{ours!r}, but {released.title} predicts {released.parameterization!r}: the UNet would be trained "
            f"to predict another target than it learnt; allowed: {released.parameterization!r}",
        )


def released_unet_config(released: Released) -> dict[str, Any]:
    return json.loads((DIFFUSERS_CONFIGS / released.configs / "unet_config.json").read_text())


def check_unet(cfg: Any, config: dict[str, Any], where: str) -> None:
    """The source's UNet (its diffusers config) is this preset's family's and has its shapes: else NeMo
    would drop every tensor of another shape and train it from random weights."""
    family = family_of(cfg.training.model)
    assert family.diffusers is not None
    if not family.diffusers.matches(config):
        from launcher.families import FAMILIES

        theirs = [f.title for f in FAMILIES if f.diffusers and f.diffusers.matches(config)]
        raise ConfigError(
            KEY,
            f"{where} describes a {theirs[0] if theirs else 'UNet of no family here (' + names() + ')'} UNet, "
            f"but training={cfg.training.run.name} trains {family.title}; allowed: weights of {family.title}",
        )
    differ = unet_differences(nemo_args(config), cfg.training.model.get("unet_config") or {})
    if differ:
        raise ConfigError(
            KEY,
            f"{where} does not match training.model.unet_config: {'; '.join(differ)}; allowed: weights whose "
            "UNet is the preset's (or the preset's unet_config set to theirs)",
        )


def preset_args(unet: dict[str, Any]) -> dict[str, Any]:
    """A preset's unet_config in data_prep.unet_names.nemo_args's form (NeMo's defaults filled in)."""
    shape = unet_shape({"unet_config": unet})
    mult = [int(m) for m in shape["channel_mult"]]
    attention = [2**level in shape["attention_resolutions"] for level in range(len(mult))]
    depth = shape["transformer_depth"]
    depths = list(depth) if isinstance(depth, list) else [depth] * len(mult)
    head_channels, heads = int(unet.get("num_head_channels", -1)), int(unet.get("num_heads", -1))
    channels = [int(shape["model_channels"]) * m for m in mult]
    per_level = [c // head_channels if head_channels > 0 else heads for c in channels]
    context = shape["context_dim"]
    return {
        **{key: shape[key] for key in ("in_channels", "out_channels", "model_channels", "num_res_blocks")},
        "channel_mult": mult,
        "attention_resolutions": sorted(shape["attention_resolutions"]),
        "context_dim": context[0] if isinstance(context, list) else context,
        "use_linear_in_transformer": bool(shape["use_linear_in_transformer"]),
        "transformer_depth": [d if on else None for d, on in zip(depths, attention, strict=True)],
        "adm_in_channels": shape["adm_in_channels"],
        "heads": [h if on else None for h, on in zip(per_level, attention, strict=True)],
    }


def unet_differences(theirs: dict[str, Any], unet: dict[str, Any]) -> list[str]:
    """Where a source's UNet (nemo_args of its diffusers config) and a preset's unet_config differ, as
    `key <theirs> there, <ours> here` (`heads`: num_heads or num_head_channels)."""
    ours = preset_args(unet)
    return [f"{key} {theirs[key]} there, {ours[key]} here" for key in theirs if theirs[key] != ours[key]]
