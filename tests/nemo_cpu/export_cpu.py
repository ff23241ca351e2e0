"""An export checked from the outside, with NeMo's and diffusers' own code (NeMo's interpreter), as a user would
use it: prints one JSON object.

    <nemo python> tests/nemo_cpu/export_cpu.py STEP_DIR CHECKPOINT [--tampered]

- the pipeline folder loaded by `DiffusionPipeline.from_pretrained` offline (HF_HUB_OFFLINE=1);
- caption -> NeMo's own text conditioning (SD's cond_stage_model, SDXL's GeneralConditioner with its size and
  crop embedders) -> NeMo's UNet, built from the checkpoint's hparams.yaml with the checkpoint's weights, against
  caption -> the pipeline's own encode_prompt (and SDXL's add_time_ids) -> its UNet: the largest difference;
- an image drawn by the pipeline (2 steps, 64 px);
- the single file loaded by `from_single_file(file, config=<folder>, local_files_only=True)`: how many tensors
  differ from the folder's;
- with --tampered: the export job's own UNet check on the folder's UNet with two of its same-shaped tensors
  swapped (a mapping fault), and the line it fails with.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import data_prep.nemo_compat  # noqa: F401  (apex GroupNorm absent off NVIDIA's container)

CAPTION = "a lighthouse on a rocky coast at sunset"
SIZES = {
    "original_size_as_tuple": (300, 200),
    "crop_coords_top_left": (12, 34),
    "target_size_as_tuple": (64, 64),
}


DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def _rounded(module, dtype):
    """NeMo's module with its weights as the export saved them (export.dtype), computing in fp32."""
    import torch

    return module.to(getattr(torch, DTYPES[dtype])).to(torch.float32).eval()


def _built(section, weights, **changes):
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    plain = OmegaConf.to_container(OmegaConf.create(section), resolve=True)
    module = instantiate(OmegaConf.create({**plain, **changes}))
    module.load_state_dict(weights, strict=True)
    return module.eval()


def _under(state, prefix):
    return {key[len(prefix) :]: value for key, value in state.items() if key.startswith(prefix)}


def nemo_conditioning(model, state, dtype):
    """(context, y or None) of CAPTION as NeMo's training computes them (ucg off)."""
    import torch

    if "conditioner_config" not in model:
        embedder = _built(model["cond_stage_config"], _under(state, "model.cond_stage_model."), device="cpu")
        return _rounded(embedder, dtype).encode([CAPTION]), None
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    section = OmegaConf.create(OmegaConf.to_container(model["conditioner_config"], resolve=True))
    for entry in section.emb_models:
        entry.emb_model.device = "cpu"  # every NeMo embedder defaults to "cuda"
    conditioner = instantiate(section)
    conditioner.load_state_dict(_under(state, "model.conditioner."), strict=True)
    conditioner = _rounded(conditioner, dtype)
    batch = {
        "captions": [CAPTION],
        **{key: torch.tensor([value], dtype=torch.float) for key, value in SIZES.items()},
    }
    with torch.no_grad():
        conditioning, _ = conditioner.get_unconditional_conditioning(batch)
    return conditioning["crossattn"], conditioning["vector"]


def pipeline_conditioning(pipe):
    """(context, added_cond_kwargs or None) of CAPTION as the pipeline computes them."""
    import torch

    with torch.no_grad():
        out = pipe.encode_prompt(
            prompt=CAPTION, device="cpu", num_images_per_prompt=1, do_classifier_free_guidance=False
        )
    if len(out) == 2:
        return out[0], None
    ids = torch.tensor(
        [[*SIZES["original_size_as_tuple"], *SIZES["crop_coords_top_left"], *SIZES["target_size_as_tuple"]]]
    )
    return out[0], {"text_embeds": out[2], "time_ids": ids.float()}


def tampered_check(pipe, nemo_unet, model):
    """The export job's UNet check on a UNet with two same-shaped tensors swapped: its error line."""
    import torch

    from launcher.families import family_of
    from launcher.jobs import export_check, export_nemo

    state = pipe.unet.state_dict()
    first = next(k for k in state if k.endswith("attn2.to_k.weight"))
    second = (
        first.replace("to_k", "to_q")
        if state[first].shape == state[first.replace("to_k", "to_q")].shape
        else None
    )
    second = second or next(
        k for k in state if k != first and k.endswith(".weight") and state[k].shape == state[first].shape
    )
    with torch.no_grad():
        a, b = state[first].clone(), state[second].clone()
        pipe.unet.get_parameter(first).copy_(b)
        pipe.unet.get_parameter(second).copy_(a)
    family = family_of(model)
    try:
        export_check.check_unet(nemo_unet, pipe, family, export_nemo.time_embedders(model, family))
    except export_nemo.ExportError as error:
        return f"{first} <-> {second}: {error}"
    return None


def main(step_dir: Path, checkpoint: Path, tampered: bool) -> dict:
    import torch
    from diffusers import DiffusionPipeline
    from omegaconf import OmegaConf

    record = json.loads((step_dir / "export.json").read_text())
    folder, single = step_dir / record["pipeline"], step_dir / record["single_file"]
    pipe = DiffusionPipeline.from_pretrained(folder, local_files_only=True, torch_dtype=torch.float32)
    model = OmegaConf.load(checkpoint.parent.parent / "hparams.yaml").cfg
    state = torch.load(checkpoint, map_location="cpu", mmap=True, weights_only=False)["state_dict"]
    unet = _built(
        model["unet_config"],
        _under(state, "model.model.diffusion_model."),
        from_pretrained=None,
        use_flash_attention=False,
    )
    unet = _rounded(unet, record["dtype"])
    context, y = nemo_conditioning(model, state, record["dtype"])
    theirs_context, added = pipeline_conditioning(pipe)
    tokens = theirs_context.shape[1]  # NeMo pads its CLIP outputs to 80 tokens with zeros; diffusers gives 77
    x = torch.randn(1, pipe.unet.config.in_channels, 16, 16, generator=torch.Generator().manual_seed(3))
    t = torch.tensor([500])
    with torch.no_grad():
        ours = unet(x, t, context=context[:, :tokens], **({"y": y} if y is not None else {}))
        theirs = pipe.unet(x, t, encoder_hidden_states=theirs_context, added_cond_kwargs=added).sample
    image = pipe(prompt=CAPTION, num_inference_steps=2, height=64, width=64, guidance_scale=3.0).images[0]
    cls = type(pipe)
    from_file = cls.from_single_file(
        str(single), config=str(folder), local_files_only=True, torch_dtype=torch.float32
    )
    differing = [
        f"{name}.{key}"
        for name, component in pipe.components.items()
        if isinstance(component, torch.nn.Module)
        for key, tensor in component.state_dict().items()
        if not torch.equal(tensor, from_file.components[name].state_dict()[key])
    ]
    return {
        "pipeline": cls.__name__,
        "prediction_type": pipe.scheduler.config.prediction_type,
        "unet_max_abs_diff": float((ours - theirs).abs().max()),
        "unet_max_abs": float(ours.abs().max()),
        "context_max_abs_diff": float((context[:, :tokens] - theirs_context).abs().max()),
        "image": [image.size[0], image.size[1], len(set(image.getdata()))],
        "single_file_differing": differing,
        "tampered": tampered_check(pipe, unet, model) if tampered else None,
    }


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), Path(sys.argv[2]), "--tampered" in sys.argv[3:])))
