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

from data_prep.unet_names import nemo_args, unet_differences
from launcher.errors import ConfigError
from launcher.families import family_of, names
from launcher.families.family import DIFFUSERS_CONFIGS, UNET_FILE, VAE_FILE, Family, Released

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
    if weights.repo_id is not None and weights.released is None:
        _check_other_family(cfg, weights)
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
                    f"{weights.repo_id} is {release.title} ({other.title}), but this training preset "
                    f"({cfg.training.run.name}) trains {weights.family.title}; allowed: an {other.title} preset, or "
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
            f"but this training preset ({cfg.training.run.name}) trains {family.title}; allowed: weights of "
            f"{family.title}",
        )
    differ = unet_differences(nemo_args(config), cfg.training.model.get("unet_config") or {})
    if differ:
        raise ConfigError(
            KEY,
            f"{where} does not match training.model.unet_config: {'; '.join(differ)}; allowed: weights whose "
            "UNet is the preset's (or the preset's unet_config set to theirs)",
        )


def host_check(cfg: Any) -> None:
    """What the submitting host can tell before anything is submitted: a folder holds a diffusers UNet of
    this preset's; a Hub repo and commit exist and serve their files to this token (when the Hub answers)."""
    weights = of(cfg)
    if weights is None:
        return
    if weights.folder is not None:
        _check_folder(cfg, weights.folder)
    elif not cfg.dry_run:  # a dry run stays offline; a real launch asks the Hub once
        _check_hub(cfg, weights)


def _check_folder(cfg: Any, folder: Path) -> None:
    from data_prep.safetensors_file import SafetensorsError, read_header

    missing = [name for name in (UNET_CONFIG, UNET_FILE, VAE_FILE) if not (folder / name).is_file()]
    if missing:
        raise ConfigError(
            KEY,
            f"{folder} holds no {', '.join(missing)}: not a diffusers folder; allowed: a folder as "
            "DiffusionPipeline.save_pretrained writes it (model_index.json, unet/, vae/, ...) or hf://<owner>/<name>",
        )
    for name in (UNET_FILE, VAE_FILE):
        try:
            read_header(folder / name)
        except SafetensorsError as exc:
            raise ConfigError(KEY, f"{exc}; allowed: safetensors weights, as diffusers saves them") from None
    check_unet(cfg, json.loads((folder / UNET_CONFIG).read_text()), str(folder / UNET_CONFIG))


def _token(cfg: Any) -> str | None:
    path = cfg.assets.hf_token_file
    if path and Path(path).is_file():
        return Path(path).read_text().strip() or None
    return None


def _check_hub(cfg: Any, weights: Weights) -> None:
    """One listing call to the Hub (HF_ENDPOINT honoured): a missing repo or commit, or a gated repo this
    token may not read, is refused; a Hub that does not answer is left to the assets job, which names it."""
    import os

    from huggingface_hub import HfApi
    from huggingface_hub.utils import (
        GatedRepoError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None).model_info(
            str(weights.repo_id), revision=weights.revision, token=_token(cfg) or False, timeout=10
        )
    except GatedRepoError:
        raise ConfigError(
            KEY,
            f"{weights.repo_id} is gated: the Hub serves it only with a token of an account that accepted its "
            "licence; allowed: assets.hf_token_file=<a file holding that token>",
        ) from None
    except RevisionNotFoundError:
        raise ConfigError(
            KEY,
            f"{weights.repo_id} has no commit {weights.revision}; allowed: a commit of its History on the Hub",
        ) from None
    except RepositoryNotFoundError:
        raise ConfigError(
            KEY,
            f"{weights.repo_id}: no such model repo on the Hub (or it is private and assets.hf_token_file gives "
            "no token that may read it); allowed: an existing repo id",
        ) from None
    except Exception:  # any other client or network error (no route, DNS, TLS, 5xx): not a refusal
        return  # the Hub does not answer here: the assets job asks again and names what it got


def notes(cfg: Any) -> tuple[str, ...]:
    """The line the plan prints: what the training starts from, under which licence, staged where."""
    weights = of(cfg)
    if weights is None:
        return ()
    read = "UNet, VAE and text encoder" if weights.diffusers.text_encoders else "UNet and VAE"
    if weights.released is not None:
        what = f"{weights.released.title} ({HUB}{weights.repo_id}@{str(weights.revision)[:12]})"
        licence = f"licence {weights.released.licence}"
    else:
        what, licence = weights.label, "its licence is on its model card"
    return (
        f"training: starts from {what}, its {read} staged by the assets job in {staged_dir(cfg, weights)}; "
        f"{licence}: read it before you ship what this trains",
    )
