"""A LoRA run's checkpoint (or .nemo) as the whole model it trained, for NeMo's conversion and inference.

A run with `model.peft` (NeMo's sdlora) saves each adapted projection's
`<path>.adapter_layer.parallel_linear_adapter.linear_in.weight` (A, rank x in) and `linear_out.weight` (B, out x
rank): MegatronLatentDiffusion's PEFT state dict holds them alone (the base stays as
`unet_config.from_pretrained` loads it), MegatronDiffusionEngine's the frozen base beside them (measured
with NeMo 2.4.1: tests/test_finetune_nemo.py).
NeMo's convert_ckpt_to_nemo.py, sd_infer.py, generate_fid_images.py and sd_xl_infer.py build the model
without adapters and load strictly, so they cannot read it. Here NeMo builds the model the run's config
describes, its base weights loaded as training loaded them (the family's model class's own
`model_provider_func`: LatentDiffusion or DiffusionEngine), and each adapted weight becomes W + s * B @ A, s
= network_alpha / rank when network_alpha is set, else 1: what LinearWrapper.forward adds (NeMo v2.0.0 and
2.4.1 attention.py). The result is a full state dict and the config without `peft`: sampled as any
fine-tuned model's, it draws what the adapters draw.

Job side: runs in NeMo's interpreter (torch, NeMo imported lazily).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from launcher.families import family_of
from launcher.sampling.nemo_archive import rewritten, rewritten_checkpoint

ADAPTER = ".adapter_layer.parallel_linear_adapter."
MODEL_PREFIX = "model."  # the Megatron module's own under which its inner model's state sits


class LoraMergeError(ValueError):
    """The adapters do not belong to the model the config builds: the message names the tensor."""


def is_lora(model_config: Any) -> bool:
    return bool((model_config or {}).get("peft"))


def scale(model_config: Any) -> float:
    tuning = model_config["peft"]["lora_tuning"]
    alpha = tuning.get("network_alpha")
    return float(alpha) / int(tuning["adapter_dim"]) if alpha else 1.0


def base_config(model_config: Any) -> dict[str, Any]:
    """The config without `peft`: what the merged model is."""
    return {key: value for key, value in dict(model_config).items() if key != "peft"}


def inner_model(model_config: Any) -> Any:
    """NeMo's model of `model_config` as its Megatron class builds it (no trainer needed: the inner module)."""
    from megatron.core import ModelParallelConfig
    from omegaconf import OmegaConf

    import data_prep.nemo_compat  # noqa: F401  (apex GroupNorm absent off NVIDIA's container)

    module, name = family_of(model_config).rehearsal.model_class.split(":")  # type: ignore[union-attr]
    cls = getattr(importlib.import_module(module), name)
    owner = SimpleNamespace(
        cfg=OmegaConf.create(base_config(model_config)), model_parallel_config=ModelParallelConfig()
    )
    return cls.model_provider_func(owner)


def base_state(model_config: Any) -> dict[str, Any]:
    """The whole model's state dict (under the Megatron module's `model.`) as NeMo builds it from the config:
    the base weights as training loaded them."""
    inner = inner_model(model_config)
    state = {MODEL_PREFIX + key: value.cpu() for key, value in inner.state_dict().items()}
    del inner
    return state


def adapted(adapters: dict[str, Any]) -> list[str]:
    """The module paths (under the Megatron module) of the projections a LoRA checkpoint adapts."""
    suffix = ADAPTER + "linear_in.weight"
    return sorted(key.removesuffix(suffix) for key in adapters if key.endswith(suffix))


def delta(model_config: Any, adapters: dict[str, Any], path: str) -> Any:
    """What the adapter of projection `path` adds to its weight: s * B @ A."""
    a, b = adapters[path + ADAPTER + "linear_in.weight"], adapters.get(path + ADAPTER + "linear_out.weight")
    if b is None:
        raise LoraMergeError(f"{path}: an adapter without its linear_out")
    return scale(model_config) * (b.float() @ a.float())


def merged(state: dict[str, Any], model_config: Any, adapters: dict[str, Any]) -> dict[str, Any]:
    """`state` (base_state's) with what the checkpoint holds besides the adapters, and the adapters folded in."""
    import torch

    saved = [key for key in adapters if ADAPTER not in key]
    foreign = [key for key in saved if key not in state]
    if foreign:
        raise LoraMergeError(f"{foreign[0]}: a tensor the model of this config does not have")
    state = {**state, **{key: adapters[key] for key in saved}}
    paths = adapted(adapters)
    if not paths:
        raise LoraMergeError(f"no adapter among the checkpoint's {len(adapters)} tensors: not a LoRA run's")
    for path in paths:
        weight, change = state.get(path + ".weight"), delta(model_config, adapters, path)
        if weight is None or tuple(change.shape) != tuple(weight.shape):
            raise LoraMergeError(f"{path}: no weight of shape {tuple(change.shape)} for its adapter")
        with torch.no_grad():
            state[path + ".weight"] = weight + change.to(weight.dtype)
    return state


def merged_state(model_config: Any, adapters: dict[str, Any]) -> dict[str, Any]:
    """The whole model's state dict, the adapters folded in."""
    return merged(base_state(model_config), model_config, adapters)


def merged_checkpoint(checkpoint: Path, model_config: Any, out: Path) -> Path:
    """`out/checkpoints/<checkpoint's name>`: the LoRA training checkpoint as a full one, with
    `out/hparams.yaml` (the config without peft) where NeMo's conversion looks for it."""
    return rewritten_checkpoint(
        checkpoint, out, base_config(model_config), lambda adapters: merged_state(model_config, adapters)
    )


def merged_nemo(nemo: Path, model_config: Any, out: Path) -> Path:
    """`out`: a copy of the LoRA run's .nemo holding the whole merged model and the config without peft (the
    other members copied as they are: nemo_archive.rewritten)."""
    return rewritten(
        nemo, out, base_config(model_config), lambda adapters: merged_state(model_config, adapters)
    )
