"""NeMo's UNet and VAE built by their own constructors from a tiny diffusers repo (tests/nemo_cpu/tiny_diffusers.py)
as the launcher configures them, against diffusers' own pipeline loaded from the same repo
(tests/test_tiny_diffusers_nemo.py). Run with NeMo's interpreter, the checkout and tests/ on PYTHONPATH:

    <nemo python> tests/nemo_cpu/tiny_diffusers_check.py CASES.json REPORT.json

CASES.json: {family: {"repo": the repo's folder, "model": the NeMo config's `model` (launcher.nemo_config.build
with training.weights=<repo>: from_pretrained and from_NeMo as the launcher sets them, the files it names
already staged), "released_unet": the repo's UNet file as released}}.

Every tensor of a tiny repo is unique (seeded per tensor), so where NeMo put it is found by value: a NeMo tensor
equal to no file tensor was left at NeMo's own init.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

# A small input: integer timesteps (NeMo's embedding is a table indexed by int(t), 0..999), 77 text tokens.
BATCH, SIDE, TOKENS, TIMESTEPS = 2, 8, 77, (7, 999)


def _digest(tensor: Any) -> str:
    return hashlib.blake2b(tensor.detach().float().contiguous().numpy().tobytes(), digest_size=16).hexdigest()


def _by_value(model: Any, file: Path, rename: Any) -> dict[str, Any]:
    """Where the file's tensors are in the model: counts, and (`rename`: file key -> the model key the
    launcher's mapping gives) the model keys holding another tensor than that mapping's."""
    from safetensors.torch import load_file

    tensors = load_file(str(file))
    source = {_digest(value): key for key, value in tensors.items()}
    assert len(source) == len(tensors), "two tensors of the file are equal: not seeded uniquely"
    found = {key: source.get(_digest(value)) for key, value in model.state_dict().items()}
    placed = {key: src for key, src in found.items() if src is not None}
    return {
        "tensors": len(found),
        "file_tensors": len(tensors),
        "filled": len(placed),
        "missing": sorted(key for key, src in found.items() if src is None),
        "unexpected": sorted(set(tensors) - set(placed.values())),
        "elsewhere": sorted(key for key, src in placed.items() if rename is not None and rename(src) != key),
    }


def _nemo_unet(section: dict[str, Any], **changes: Any) -> Any:
    from hydra.utils import instantiate

    return instantiate({**section, **changes}).eval()


def _unet_inputs(config: dict[str, Any], generator: Any) -> dict[str, Any]:
    import torch

    return {
        "x": torch.randn(BATCH, config["in_channels"], SIDE, SIDE, generator=generator),
        "t": torch.tensor(TIMESTEPS),
        "context": torch.randn(BATCH, TOKENS, config["cross_attention_dim"], generator=generator),
    }


def _sdxl_vector(model: dict[str, Any], pooled: Any, generator: Any) -> tuple[Any, Any]:
    """(NeMo's `y`: the pooled text then the preset's ConcatTimestepEmbedderND embedders in its order,
    diffusers' time_ids for the same sizes)."""
    import torch
    from hydra.utils import instantiate

    sizes = {
        "original_size_as_tuple": torch.tensor([[512.0, 384.0], [1024.0, 1024.0]]),
        "crop_coords_top_left": torch.tensor([[0.0, 32.0], [16.0, 0.0]]),
        "target_size_as_tuple": torch.tensor([[64.0, 64.0], [1024.0, 1024.0]]),
    }
    parts, keys = [pooled], []
    for emb in model["conditioner_config"]["emb_models"]:
        if emb["emb_model"]["_target_"].endswith(".ConcatTimestepEmbedderND"):
            # device: the preset leaves NeMo's default, which moves the output to the GPU.
            parts.append(instantiate({**emb["emb_model"], "device": "cpu"})(sizes[emb["input_key"]]))
            keys.append(emb["input_key"])
    assert keys == list(sizes), keys  # diffusers' time_ids order: original size, crop, target
    return torch.cat(parts, dim=-1), torch.cat([sizes[key] for key in keys], dim=-1)


def unet_report(case: dict[str, Any], pipeline: Any, generator: Any) -> dict[str, Any]:
    import torch
    from safetensors.torch import load_file

    from data_prep.unet_names import Layout, diffusers_to_nemo

    section = case["model"]["unet_config"]
    theirs = pipeline.unet
    layout = Layout.of(theirs.config)
    ours = _nemo_unet(section)  # from_pretrained and from_NeMo as the launcher sets them
    from_nemo = bool(section["from_NeMo"])
    staged = Path(section["from_pretrained"])
    released = Path(case["released_unet"])
    if from_nemo:
        rename = {key: key for key in load_file(str(staged))}.get  # the staged names are NeMo's
        assert {diffusers_to_nemo(k, layout) for k in load_file(str(released))} == set(load_file(str(staged)))
    else:
        rename = lambda key: diffusers_to_nemo(key, layout)  # noqa: E731
    report: dict[str, Any] = {"from_NeMo": from_nemo, "loaded": _by_value(ours, staged, rename)}
    inputs = _unet_inputs(theirs.config, generator)
    extra: dict[str, Any] = {}
    nemo_y = None
    if theirs.config.addition_embed_type == "text_time":
        time_width = 6 * theirs.config.addition_time_embed_dim  # 2 numbers each of 3 sizes
        pooled = torch.randn(
            BATCH, theirs.config.projection_class_embeddings_input_dim - time_width, generator=generator
        )
        nemo_y, time_ids = _sdxl_vector(case["model"], pooled, generator)
        extra["added_cond_kwargs"] = {"text_embeds": pooled, "time_ids": time_ids}
        seen: dict[str, Any] = {}
        hook = theirs.add_embedding.register_forward_pre_hook(lambda _m, args: seen.update(aug=args[0]))
    with torch.no_grad():
        expected = theirs(inputs["x"], inputs["t"], encoder_hidden_states=inputs["context"], **extra).sample
        got = ours(inputs["x"], timesteps=inputs["t"], context=inputs["context"], y=nemo_y)
        report["max_abs_diff"] = float((got - expected).abs().max())
        report["output_std"] = float(expected.std())
        if nemo_y is not None:
            hook.remove()
            report["y_max_abs_diff"] = float((nemo_y - seen["aug"]).abs().max())
            # NeMo's own mapping on the file as released (what the launcher avoids for SDXL).
            own = _nemo_unet(section, from_pretrained=str(released), from_NeMo=False)
            report["nemo_mapping"] = _by_value(own, released, lambda key: diffusers_to_nemo(key, layout))
            out = own(inputs["x"], timesteps=inputs["t"], context=inputs["context"], y=nemo_y)
            report["nemo_mapping"]["max_abs_diff"] = float((out - expected).abs().max())
    return report


def vae_report(case: dict[str, Any], pipeline: Any, generator: Any) -> dict[str, Any]:
    import torch
    from hydra.utils import instantiate

    section = case["model"]["first_stage_config"]
    ours = instantiate(section).eval()  # from the staged file (data_prep.vae_names), NeMo's own mapping
    theirs = pipeline.vae
    repo_file = Path(case["repo"]) / "vae/diffusion_pytorch_model.safetensors"
    # By value through both renames: the staged file is the repo's bytes under other names.
    # By value through both renames (the staged file holds the repo's bytes under other names); where each
    # one goes is NeMo's mapping's alone: the decode below checks it.
    report: dict[str, Any] = {"loaded": _by_value(ours, repo_file, None)}
    z = torch.randn(1, theirs.config.latent_channels, SIDE, SIDE, generator=generator)
    with torch.no_grad():
        expected = theirs.decode(z).sample
        report["max_abs_diff"] = float((ours.decode(z) - expected).abs().max())
        report["output_std"] = float(expected.std())
    return report


def main() -> None:
    import torch
    from diffusers import DiffusionPipeline

    import data_prep.nemo_compat  # noqa: F401  (apex GroupNorm absent off NVIDIA's container)

    cases, out = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
    report = {}
    for family, case in cases.items():
        pipeline = DiffusionPipeline.from_pretrained(case["repo"], local_files_only=True)
        generator = torch.Generator().manual_seed(0)
        report[family] = {
            "pipeline": type(pipeline).__name__,
            "unet": unet_report(case, pipeline, generator),
            "vae": vae_report(case, pipeline, generator),
        }
    out.write_text(json.dumps(report))


if __name__ == "__main__":
    main()
