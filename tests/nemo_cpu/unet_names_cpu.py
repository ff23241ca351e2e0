"""The released models' UNets and VAEs, by name and shape only: diffusers' own classes built from the shipped
configs and NeMo's own classes built from the presets' sections, all on the meta device (no weights, no
download), and the launcher's staging between them (tests/test_unet_names.py). Run with NeMo's interpreter:

    <nemo python> tests/nemo_cpu/unet_names_cpu.py CASES.json REPORT.json   # the checkout, tests/ on PYTHONPATH

CASES.json: {name: {"unet": diffusers unet config, "vae": diffusers vae config, "unet_config": the preset's
NeMo unet_config, "first_stage_config": its first_stage_config, "stages_unet": the family's choice}}, with
from_NeMo as the launcher sets it (launcher.nemo_config.build).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _meta_copy(state: dict[str, Any]) -> dict[str, Any]:
    """A fresh meta tensor per key (state_dict() may hand out views that share one object)."""
    import torch

    return {key: torch.empty(value.shape, device="meta") for key, value in state.items()}


def _nemo(section: dict[str, Any]) -> Any:
    """NeMo's own class of a preset's section, on the meta device, nothing loaded at build."""
    import torch
    from hydra.utils import instantiate

    section = {**section, "from_pretrained": None}
    if "use_flash_attention" in section:
        section["use_flash_attention"] = False  # a CUDA kernel; the tensors are the same either way
    with torch.device("meta"):
        return instantiate(section)


def unet_report(case: dict[str, Any]) -> dict[str, Any]:
    import torch
    from diffusers import UNet2DConditionModel
    from diffusers.loaders.single_file_utils import convert_ldm_unet_checkpoint

    from data_prep.unet_names import Layout, diffusers_to_nemo, diffusers_to_original, nemo_to_original
    from nemo_cpu.nemo_loading import parameters, placed

    with torch.device("meta"):
        theirs = UNet2DConditionModel.from_config(case["unet"])
    source = _meta_copy(theirs.state_dict())
    ours = _nemo(case["unet_config"])
    nemo_state = ours.state_dict()
    layout = Layout.of(case["unet"])
    report: dict[str, Any] = {
        "tensors": len(source),
        "parameters": parameters(source, source),
        "nemo_tensors": len(nemo_state),
        "nemo_parameters": parameters(nemo_state, nemo_state),
    }
    # NeMo's own diffusers mapping (from_NeMo false) on the file as released.
    by_nemo = placed(ours, source, from_nemo=False)
    report["nemo_mapping"] = {
        **by_nemo.counts(),
        "unexpected_parameters": parameters(source, by_nemo.unexpected),
        "first_unexpected": by_nemo.unexpected[:3],
        # Each tensor NeMo placed went where the launcher's mapping puts it.
        "differs_from_launcher": sorted(
            key for key, src in by_nemo.filled.items() if diffusers_to_nemo(src, layout) != key
        ),
    }
    # The launcher's mapping (data_prep.unet_names) then NeMo's loader with from_NeMo true.
    staged = {diffusers_to_nemo(key, layout): value for key, value in source.items()}
    assert len(staged) == len(source), "two diffusers tensors under one NeMo name"
    by_launcher = placed(ours, staged, from_nemo=True)
    report["launcher_mapping"] = {
        **by_launcher.counts(),
        "renamed_back": sorted(k for k, s in by_launcher.filled.items() if k != s),
    }
    # The path the launcher takes for this family, as it sets from_NeMo.
    from_nemo = bool(case["unet_config"].get("from_NeMo"))
    assert from_nemo == case["stages_unet"], (from_nemo, case["stages_unet"])
    report["launcher_path"] = (by_launcher if from_nemo else by_nemo).counts()
    # diffusers' own single-file converter (original -> diffusers) undoes diffusers_to_original exactly; its
    # input, the original names, are also NeMo's own names in the original layout.
    original = {diffusers_to_original(key, layout): key for key in source}
    converted = convert_ldm_unet_checkpoint(
        {f"model.diffusion_model.{key}": value for key, value in original.items()}, case["unet"]
    )
    report["diffusers_converter"] = {
        "converted": len(converted),
        "not_inverse": sorted(k for k in set(converted) | set(source) if converted.get(k) != k),
        "original_not_nemo": sorted(set(original) ^ {nemo_to_original(k) for k in nemo_state}),
    }
    return report


def vae_report(case: dict[str, Any]) -> dict[str, Any]:
    import torch
    from diffusers import AutoencoderKL
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

    from data_prep.vae_names import nemo_readable
    from nemo_cpu.nemo_loading import parameters, placed

    with torch.device("meta"):
        theirs = AutoencoderKL.from_config(case["vae"])
    source = _meta_copy(theirs.state_dict())
    ours = _nemo(case["first_stage_config"])
    nemo_state = ours.state_dict()
    report: dict[str, Any] = {
        "tensors": len(source),
        "parameters": parameters(source, source),
        "nemo_tensors": len(nemo_state),
    }
    # NeMo's mapping on current diffusers' names as saved: its middle attention is left out.
    raw = placed(ours, source, from_nemo=False)
    report["nemo_mapping"] = {**raw.counts(), "first_missing": raw.missing[:2]}
    # data_prep.vae_names (the assets job's staging, on the header), then NeMo's mapping.
    staged: dict[str, Any] = {}
    renamed_from: dict[str, str] = {}
    for key, value in source.items():
        new_key, info = nemo_readable(key, {"shape": list(value.shape)})
        staged[new_key] = (
            value if list(value.shape) == info["shape"] else torch.empty(info["shape"], device="meta")
        )
        renamed_from[new_key] = key
    by_launcher = placed(ours, staged, from_nemo=False)
    report["launcher_mapping"] = by_launcher.counts()
    # diffusers' own converter (original layout = NeMo's VAE names -> diffusers) puts every NeMo tensor at
    # the diffusers key whose tensor the launcher's path puts there.
    nemo_source = _meta_copy(nemo_state)
    converted = convert_ldm_vae_checkpoint(nemo_source, case["vae"])
    by_identity = {id(tensor): key for key, tensor in nemo_source.items()}
    diffusers_of = {}
    for key, tensor in converted.items():
        while tensor._base is not None:
            tensor = tensor._base
        diffusers_of[by_identity[id(tensor)]] = key
    launcher_of = {nemo_key: renamed_from[staged_key] for nemo_key, staged_key in by_launcher.filled.items()}
    report["diffusers_converter"] = {
        "converted": len(converted),
        "not_diffusers_keys": sorted(set(converted) ^ set(source)),
        "shapes_differ": sorted(
            k for k, v in converted.items() if k in source and v.shape != source[k].shape
        ),
        "differs_from_launcher": sorted(k for k in nemo_state if diffusers_of.get(k) != launcher_of.get(k)),
    }
    return report


def main() -> None:
    import data_prep.nemo_compat  # noqa: F401  (apex GroupNorm absent off NVIDIA's container)

    cases = json.loads(Path(sys.argv[1]).read_text())
    report = {name: {"unet": unet_report(case), "vae": vae_report(case)} for name, case in cases.items()}
    Path(sys.argv[2]).write_text(json.dumps(report))


if __name__ == "__main__":
    main()
