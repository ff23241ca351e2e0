"""What of a NeMo Stable Diffusion config needs a GPU, and the settings that run the same model on CPU: the
CUDA kernels (flash attention, torch.compile's inductor, CUDA graphs, FP8, the nsys profiler) off, every
module's `device` "cpu", 16-bit autocast (CUDA's) as bf16. The rehearsal (launcher/jobs/rehearsal_config.py)
and a training on a CPU partition (launcher/nemo_config.py) apply the same ones; the weights, the data and
what NeMo computes stay as planned. Plain dicts only (no torch).
"""

from __future__ import annotations

from typing import Any

KERNEL = "a CUDA kernel"


def set_value(section: dict[str, Any], key: str, value: Any, why: str, changes: list[str], path: str) -> None:
    """Set `key` and note the change, only where it changes something."""
    if section.get(key) != value:
        changes.append(f"{path}.{key}: {section.get(key)!r} -> {value!r} ({why})")
        section[key] = value


def devices(section: Any, path: str) -> list[tuple[str, dict[str, Any]]]:
    """(dotted path, section) of every section under `section` naming a `device`: NeMo's modules take
    "cuda" there (their default too).

    >>> [p for p, _ in devices({"a": {"device": "cuda"}, "b": [{"emb_model": {"device": "cuda"}}]}, "model")]
    ['model.a', 'model.b.0.emb_model']
    """
    found = [(path, section)] if isinstance(section, dict) and "device" in section else []
    children = section.items() if isinstance(section, dict) else enumerate(section)
    for key, child in children if isinstance(section, dict | list) else ():
        if isinstance(child, dict | list):
            found += devices(child, f"{path}.{key}")
    return found


def on_cpu(config: dict[str, Any], changes: list[str]) -> None:
    """`config` (trainer, model) set to run on CPU, in place; each change noted in `changes`.

    >>> config = {"trainer": {"precision": "16-mixed"}, "model": {"inductor": True, "unet_config": {}}}
    >>> changes = []
    >>> on_cpu(config, changes)
    >>> config["trainer"]["precision"], config["model"]["inductor"], len(changes)
    ('bf16-mixed', False, 3)
    """
    trainer = config.setdefault("trainer", {})
    set_value(trainer, "accelerator", "cpu", "no GPU", changes, "trainer")
    if str(trainer.get("precision")) in ("16", "16-mixed"):
        set_value(trainer, "precision", "bf16-mixed", "16-bit autocast is CUDA's", changes, "trainer")
    model = config.setdefault("model", {})
    for key, value in (("inductor", False), ("capture_cudagraph_iters", -1)):
        if key in model:
            set_value(model, key, value, KERNEL, changes, "model")
    if "nsys_profile" in model:
        set_value(model["nsys_profile"], "enabled", False, "a CUDA profiler", changes, "model.nsys_profile")
    unet = model.setdefault("unet_config", {})
    for key in ("use_flash_attention", "use_te_fp8"):
        if key in unet:
            set_value(unet, key, False, KERNEL, changes, "model.unet_config")
    for path, section in devices(model, "model"):  # text encoders, SDXL's cached-embedding readers
        set_value(section, "device", "cpu", "no GPU", changes, path)
