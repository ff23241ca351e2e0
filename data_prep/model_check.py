"""NeMo's three Stable Diffusion modules built from the resolved training config, on CPU, offline.

Before any GPU time, data_check (with --model-check) instantiates the config's `_target_`s the way
NeMo does (hydra.utils.instantiate), for SD and SDXL configs alike: the UNet (an unknown key fails here,
not after the queue), the VAE built by NeMo's own class from its staged file, with NeMo's own
diffusers->NeMo key renaming (NeMo only PRINTS missing or unexpected keys; here any one fails, naming the
fix), and each text encoder from its staged folder or file, which encodes one caption: their widths together
must be the UNet's cross-attention width (context_dim).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from data_prep.family_settings import FamilySettings

CAPTION = "a photograph of an astronaut riding a horse"


class ModelCheckError(Exception):
    """A module cannot be built or loaded: the message names the config key."""


def _instantiate(section: DictConfig, key: str, **overrides: Any) -> Any:
    from hydra.utils import instantiate

    try:
        return instantiate(section, **overrides)
    except Exception as exc:  # hydra wraps the constructor's own error; its text names the bad key
        raise ModelCheckError(f"model.{key}: NeMo cannot build it: {exc}".replace("\n", " ")) from None


def check_unet(model: DictConfig, release: Path | None = None) -> dict[str, Any]:
    """NeMo's UNet from the config; with `release` (training.weights' diffusers folder) loaded from it through
    NeMo's own path, every tensor counted and its output compared with diffusers' (data_prep.weights_check)."""
    if release is not None:
        from data_prep.weights_check import WeightsCheckError, check_released

        try:
            return check_released(model, release)
        except WeightsCheckError as exc:
            raise ModelCheckError(str(exc)) from None
    section = OmegaConf.create(OmegaConf.to_container(model.unet_config, resolve=True))
    notes = []
    if section.get("from_pretrained"):  # training.init_from's file is written just before training
        section.from_pretrained = None
        notes.append("built without unet_config.from_pretrained (its weights are loaded by training)")
    # flash-attn is a CUDA kernel: without it (CPU venv) build the same weights with torch attention.
    if section.get("use_flash_attention") and importlib.util.find_spec("flash_attn") is None:
        section.use_flash_attention = False
        notes.append("flash_attn not installed here: built with use_flash_attention=false (same weights)")
    unet = _instantiate(section, "unet_config")
    return {"parameters": sum(p.numel() for p in unet.parameters()), "notes": notes}


VAE_KEY = "training.model.first_stage_config.from_pretrained"
# Current diffusers' names of the VAE's middle attention, which NeMo 2.4's key mapping does not know.
CURRENT_DIFFUSERS_ATTENTION = (".to_q.", ".to_k.", ".to_v.", ".to_out.0.")


def _load_with_nemo(section: DictConfig) -> tuple[list[Any], ...]:
    """NeMo's own load: the config's first-stage class (AutoencoderKL, or SDXL's AutoencoderKLInferenceWrapper)
    built with its from_pretrained file, as training builds it. Its __init__ reads the file, renames the keys
    and loads them through _load_pretrained_model, then only prints what did not fit: here that method's
    answer (missing, unexpected, mismatched, load errors) is kept on the way out, NeMo's code unchanged."""
    from unittest import mock

    from hydra.utils import get_class

    cls = get_class(section._target_)
    answers: list[tuple[list[Any], ...]] = []
    nemo_load = cls._load_pretrained_model

    def load_and_keep(self: Any, *args: Any, **kwargs: Any) -> Any:
        answer = nemo_load(self, *args, **kwargs)
        answers.append(answer)
        return answer

    with mock.patch.object(cls, "_load_pretrained_model", load_and_keep):
        _instantiate(section, "first_stage_config")
    if not answers:
        raise ModelCheckError(f"{VAE_KEY}: {section._target_} loaded no weights from it")
    return answers[0]


def _vae_fix(unexpected: list[str]) -> str:
    if any(name in key for key in unexpected for name in CURRENT_DIFFUSERS_ATTENTION):
        return (
            "its middle attention has current diffusers' names (to_q/to_k/to_v/to_out.0), which NeMo 2.4 "
            "does not map, so those layers would train random; fix: give the asset it comes from "
            "assets.<name>.nemo_vae (assets.sdxl_vae has it), rerun the pretrained_assets job and point "
            f"{VAE_KEY} at the converted file (<local_dir>/<nemo_vae.file>)"
        )
    return f"fix: point {VAE_KEY} at the VAE this model's first_stage_config describes"


def check_vae(model: DictConfig) -> dict[str, Any]:
    path = model.first_stage_config.get("from_pretrained")
    if not path or not os.path.isfile(path):
        raise ModelCheckError(
            f"{VAE_KEY}={path!r}: no such file; run the pretrained_assets job or fix the path"
        )
    section = OmegaConf.create(OmegaConf.to_container(model.first_stage_config, resolve=True))
    missing, unexpected, mismatched, errors = _load_with_nemo(section)
    problems = {
        "missing": sorted(missing),
        "unexpected": sorted(unexpected),
        "mismatched": [str(m) for m in mismatched],
        "load_errors": [str(e) for e in errors],
    }
    found = {name: values for name, values in problems.items() if values}
    if found:
        detail = "; ".join(f"{len(v)} {name} (e.g. {v[0]})" for name, v in found.items())
        raise ModelCheckError(
            f"{VAE_KEY}={path}: the weights do not fit NeMo's {section._target_.rsplit('.', 1)[-1]} "
            f"(from_NeMo={bool(section.get('from_NeMo', False))}): {detail}; {_vae_fix(problems['unexpected'])}"
        )
    return {"file": path, "class": section._target_, "missing": 0, "unexpected": 0}


def _encode(key: str, section: DictConfig) -> tuple[str, Any]:
    """One text encoder built by NeMo from its staged weights, and its token embeddings of CAPTION."""
    version = section.get("version")
    # OpenCLIP (SD 2.0, SDXL's second encoder) reads one weights file; Hugging Face CLIP a folder.
    is_file = "OpenCLIP" in str(section.get("_target_", ""))
    kind, exists = ("file", Path.is_file) if is_file else ("folder", Path.is_dir)
    if not version or not exists(Path(version)):
        raise ModelCheckError(
            f"model.{key}.version={version!r}: no such {kind}; run the pretrained_assets job or fix it"
        )
    out = _instantiate(section, key, device="cpu").encode([CAPTION])
    return version, out[0] if isinstance(out, (tuple, list)) else out  # SDXL's pooled output aside


def check_text_encoder(model: DictConfig, keys: tuple[str, ...]) -> dict[str, Any]:
    """Each text encoder, at `keys` under `model` (the family's: SD's cond_stage_config, SDXL's caption
    embedders); the UNet's cross-attention width is their token widths together (SDXL's conditioner
    concatenates them)."""
    found = {key: _encode(key, OmegaConf.select(model, key) or OmegaConf.create()) for key in keys}
    widths = [tokens.shape[-1] for _, tokens in found.values()]
    context_dim = model.unet_config.get("context_dim")
    if context_dim is not None and sum(widths) != context_dim:
        (key, (version, _)), *more = found.items()
        where = f"model.{key}.version={version}" if not more else "model.unet_config.context_dim"
        given = " + ".join(map(str, widths)) + (f" = {sum(widths)}" if more else "")
        raise ModelCheckError(
            f"{where}: the text encoder{'s give' if more else ' gives'} {given}-wide embeddings but "
            f"model.unet_config.context_dim is {context_dim}"
        )
    reports = {
        key: {"folder": version, "embedding_shape": list(tokens.shape)}
        for key, (version, tokens) in found.items()
    }
    return next(iter(reports.values())) if len(reports) == 1 else reports


def check_models(
    model: DictConfig, settings: FamilySettings, release: Path | None = None
) -> tuple[dict[str, Any], list[str]]:
    """Each module checked on its own, so one report names every problem; `release`: training.weights'
    diffusers folder, which the UNet is loaded from and compared with."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # as the training job runs: nothing from the Hub
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import data_prep.nemo_compat  # noqa: F401  (apex GroupNorm absent off NVIDIA's container)

    report: dict[str, Any] = {}
    errors: list[str] = []
    checks = (
        ("unet", lambda m: check_unet(m, release)),
        ("vae", check_vae),
        ("text_encoder", lambda m: check_text_encoder(m, settings.text_encoders)),
    )
    for name, check in checks:
        try:
            report[name] = check(model)
        except ModelCheckError as exc:
            errors.append(str(exc))
    return report, errors
