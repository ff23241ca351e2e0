"""The export of a LoRA run (`model.peft`, NeMo's sdlora): its checkpoint holds the adapters (SD's alone, SDXL's
beside the frozen base: launcher/sampling/lora_merge.py), which diffusers, ComfyUI and A1111 read in two ways:

- the whole fine-tuned model, the adapters merged into the base (W + s * B @ A, as NeMo's LinearWrapper adds
  them): what the pipeline folder and the single file hold, exported and checked as any trained model is;
- the adapters alone, `lora/pytorch_lora_weights.safetensors` in diffusers' own LoRA format, which
  `pipeline.load_lora_weights` reads onto the base model: `unet.<diffusers module>.lora_A.weight` (NeMo's
  linear_in) and `lora_B.weight` (linear_out, NeMo's scale network_alpha / rank folded in: diffusers reads an
  adapter saved without an alpha at scale 1). The module names come from diffusers' own converter
  (convert_ldm_unet_checkpoint) run on the names, not from a map of ours.

The adapters are checked by diffusers itself: the base model (NeMo's base weights, converted by the same
converter) with load_lora_weights of that file must give the merged folder's UNet output.

Runs in NeMo's interpreter, on the export's CPU node: NeMo's model is built with nemo_cpu's replacements of its
CUDA-only calls (torch, NeMo and diffusers imported lazily).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from data_prep.unet_names import nemo_to_original
from launcher.jobs.export_nemo import ORIGINAL_UNET, UNET, ExportError, under
from launcher.sampling.lora_merge import ADAPTER, adapted, base_config, base_state, merged, scale


def merged_states(model: Any, checkpoint_state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """(the whole model's state, adapters merged; the base's state; the config without peft)."""
    from launcher.jobs.nemo_cpu import patch_for_cpu

    patch_for_cpu()  # NeMo's model class allocates on torch.cuda.current_device(): off a GPU, replaced
    base = base_state(model)
    return merged(base, model, checkpoint_state), base, base_config(model)


def _diffusers_modules(paths: list[str], unet_keys: list[str], config: Any) -> dict[str, str]:
    """{NeMo module path of an adapted projection: its diffusers module path}, by diffusers' own converter."""
    from diffusers.loaders.single_file_utils import convert_ldm_unet_checkpoint

    names = {ORIGINAL_UNET + nemo_to_original(key): key for key in unet_keys}
    converted = convert_ldm_unet_checkpoint(names, dict(config))
    ours = {nemo: diffusers for diffusers, nemo in converted.items()}
    found = {path: ours.get(path.removeprefix(UNET) + ".weight") for path in paths}
    lost = [path for path, name in found.items() if name is None]
    if lost:
        raise ExportError(f"{lost[0]}: diffusers' converter gives this adapted projection no name")
    return {path: str(name).removesuffix(".weight") for path, name in found.items()}


def write(path: Path, model: Any, adapters: dict[str, Any], base: dict[str, Any], unet_config: Any) -> int:
    """The adapters as `path` (pytorch_lora_weights.safetensors); returns how many projections."""
    from safetensors.torch import save_file

    paths = adapted(adapters)
    modules = _diffusers_modules(paths, list(under(base, UNET)), unet_config)
    factor, tensors = scale(model), {}
    for projection in paths:
        name, adapter = f"unet.{modules[projection]}", f"{projection}{ADAPTER}"
        tensors[f"{name}.lora_A.weight"] = adapters[f"{adapter}linear_in.weight"].float().contiguous()
        tensors[f"{name}.lora_B.weight"] = (
            adapters[f"{adapter}linear_out.weight"].float() * factor
        ).contiguous()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={"format": "pt"})
    path.chmod(0o644)  # safetensors writes 0600: the team reads the export
    return len(paths)


def check(pipe: Any, base: dict[str, Any], path: Path, inputs: dict[str, Any]) -> dict[str, float]:
    """diffusers' base UNet (NeMo's base weights through diffusers' converter) with load_lora_weights of the
    file against the merged folder's UNet (`pipe`'s), on `inputs` (the UNet check's); `pipe` keeps its UNet."""
    import torch
    from diffusers import UNet2DConditionModel
    from diffusers.loaders.single_file_utils import convert_ldm_unet_checkpoint

    from launcher.jobs.export_check import compared

    merged_unet = pipe.unet
    with torch.no_grad():
        reference = merged_unet(**inputs).sample
    original = {ORIGINAL_UNET + nemo_to_original(key): value for key, value in under(base, UNET).items()}
    base_unet = UNet2DConditionModel.from_config(merged_unet.config)
    base_unet.load_state_dict(convert_ldm_unet_checkpoint(original, dict(merged_unet.config)), strict=True)
    pipe.unet = base_unet.eval()
    try:
        with torch.no_grad():
            without = pipe.unet(**inputs).sample
        pipe.load_lora_weights(str(path.parent), weight_name=path.name)
        with torch.no_grad():
            measured = compared(
                "the UNet with load_lora_weights of the exported adapters",
                reference,
                pipe.unet(**inputs).sample,
            )
    finally:
        pipe.unet = merged_unet
    measured["without_adapters_max_abs_diff"] = float((without - reference).abs().max())
    return measured
