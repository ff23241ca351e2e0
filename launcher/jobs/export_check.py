"""The export's checks, before anything is renamed into place: the pipeline folder loaded by diffusers offline
against NeMo's own modules holding the checkpoint's weights, on the same fixed small inputs, in fp32 (NeMo's
weights rounded to the export's dtype first); then the single file loaded by diffusers with the folder's
configs against the folder. Each returns what it measured; a difference raises ExportError naming it.

- every tensor of every component is filled (diffusers leaves a weight the file lacks on the meta device and
  says nothing);
- the UNet: integer timesteps (NeMo's timestep embedding is a table indexed by int(t)), random latents and
  text context; a UNet with vector conditioning gets NeMo's `y` = [pooled text | each time embedder's output]
  against diffusers' added_cond_kwargs (text_embeds, time_ids);
- the VAE's decoder on a fixed latent;
- the text encoders: the pipeline's own encode_prompt of one caption against NeMo's embedders (their tokens
  concatenated as GeneralConditioner does; NeMo pads its CLIP outputs to a multiple of 8 tokens with zeros,
  which diffusers does not: the padding is checked to be zeros), and the pooled text where the pipeline has
  one;
- the scheduler's alphas_cumprod against NeMo's own make_beta_schedule of the trained schedule.
"""

from __future__ import annotations

from typing import Any

from launcher.families.family import DIFFUSERS_BETA_SCHEDULES, Family
from launcher.jobs.export_diffusers import schedule_of
from launcher.jobs.export_nemo import ExportError, TextPart

# fp32: at most this absolute difference, and this fraction of the largest output (a model trained a few
# steps from NeMo's zero-initialised output layers answers with values near 1e-3: the absolute bound alone
# would pass anything).
ATOL, RTOL = 1e-4, 1e-3
CAPTION = "a photograph of an astronaut riding a horse"
TIMESTEPS = (1, 999)


def compared(what: str, ours: Any, theirs: Any) -> dict[str, float]:
    import torch

    if tuple(ours.shape) != tuple(theirs.shape):
        raise ExportError(f"{what}: diffusers gives shape {tuple(theirs.shape)}, NeMo {tuple(ours.shape)}")
    diff = float((ours.float() - theirs.float()).abs().max())
    scale = float(ours.float().abs().max())
    if not torch.isfinite(ours).all() or diff > ATOL or diff > RTOL * scale:
        raise ExportError(
            f"{what} differs: max |diffusers - NeMo| {diff:.3g} (NeMo's largest value {scale:.3g}; allowed "
            f"{ATOL:g} and {RTOL:g} of it)"
        )
    return {"max_abs_diff": diff, "max_abs": scale}


def check_filled(pipe: Any) -> int:
    """Every parameter and buffer of every model component holds data; returns how many tensors."""
    import torch

    count = 0
    for name, component in pipe.components.items():
        if not isinstance(component, torch.nn.Module):
            continue
        for key, tensor in [*component.named_parameters(), *component.named_buffers()]:
            if tensor.is_meta:
                raise ExportError(f"{name}.{key}: not in the exported weights (left unset by diffusers)")
            count += 1
    return count


def _time_inputs(time_embedders: list[tuple[str, Any]], batch: int) -> tuple[Any, Any]:
    """NeMo's vector of the time embedders (config order) and diffusers' time_ids of the same values."""
    import torch

    values = {
        key: torch.tensor([[100.0 + 37 * i, 60.0 + 11 * i]] * batch)
        for i, (key, _) in enumerate(time_embedders)
    }
    nemo = torch.cat([embedder(values[key]) for key, embedder in time_embedders], dim=1)
    return values, nemo


def unet_inputs(
    pipe: Any, family: Family, time_embedders: list[tuple[str, Any]]
) -> tuple[tuple[Any, ...], dict[str, Any], dict[str, Any]]:
    """The same fixed inputs for NeMo's UNet (positional x and t, then keywords) and diffusers' (keywords):
    integer timesteps, random latents and text context, and with vector conditioning NeMo's `y` of the time
    embedders against diffusers' text_embeds + time_ids."""
    import torch

    assert family.diffusers is not None
    config = pipe.unet.config
    generator = torch.Generator().manual_seed(0)
    side = 2 ** len(config.block_out_channels)
    x = torch.randn(len(TIMESTEPS), config.in_channels, side, side, generator=generator)
    t = torch.tensor(TIMESTEPS)
    context = torch.randn(len(TIMESTEPS), 77, config.cross_attention_dim, generator=generator)
    nemo_kwargs: dict[str, Any] = {"context": context}
    added: dict[str, Any] = {}
    if family.diffusers.time_ids:
        values, vector = _time_inputs(time_embedders, len(TIMESTEPS))
        pooled_width = config.projection_class_embeddings_input_dim - vector.shape[1]
        pooled = torch.randn(len(TIMESTEPS), pooled_width, generator=generator)
        nemo_kwargs["y"] = torch.cat([pooled, vector], dim=1)
        ids = [values[key] for key in family.diffusers.time_ids if key in values]
        added = {"text_embeds": pooled, "time_ids": torch.cat(ids, dim=1)}
    theirs = {
        "sample": x,
        "timestep": t,
        "encoder_hidden_states": context,
        "added_cond_kwargs": added or None,
    }
    return (x, t), nemo_kwargs, theirs


def check_unet(
    nemo_unet: Any, pipe: Any, family: Family, time_embedders: list[tuple[str, Any]]
) -> dict[str, float]:
    import torch

    positional, nemo_kwargs, theirs_kwargs = unet_inputs(pipe, family, time_embedders)
    with torch.no_grad():
        ours = nemo_unet(*positional, **nemo_kwargs)
        theirs = pipe.unet(**theirs_kwargs).sample
    return compared("the UNet's output", ours, theirs)


def check_vae(nemo_vae: Any, pipe: Any) -> dict[str, float]:
    import torch

    config = pipe.vae.config
    z = torch.randn(1, config.latent_channels, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return compared("the VAE's decoded image", nemo_vae.decode(z), pipe.vae.decode(z).sample)


def _nemo_text(texts: list[tuple[TextPart, Any]]) -> tuple[Any, Any]:
    """The caption's embeddings as NeMo's conditioner gives them: tokens concatenated, the pooled text of
    the embedder that returns one."""
    import torch

    tokens, pooled = [], None
    with torch.no_grad():
        for _, embedder in texts:
            out = embedder.encode([CAPTION])
            if isinstance(out, (tuple, list)):
                out, pooled = out[0], out[1]
            tokens.append(out)
    return torch.cat(tokens, dim=2), pooled


def check_text(pipe: Any, texts: list[tuple[TextPart, Any]]) -> dict[str, Any]:
    import torch

    ours, ours_pooled = _nemo_text(texts)
    with torch.no_grad():
        out = pipe.encode_prompt(
            prompt=CAPTION, device="cpu", num_images_per_prompt=1, do_classifier_free_guidance=False
        )
    theirs = out[0]
    length = theirs.shape[1]
    if ours[:, length:].abs().sum() != 0:
        raise ExportError(
            f"the text embeddings differ: NeMo's tokens past the first {length} are not padding"
        )
    measured = {"tokens": compared("the text encoders' embeddings", ours[:, :length], theirs)}
    theirs_pooled = out[2] if len(out) == 4 else None  # StableDiffusionXLPipeline: (embeds, neg, pooled, neg)
    if (ours_pooled is None) != (theirs_pooled is None):
        raise ExportError("the pooled text embedding: only one of NeMo and the pipeline gives one")
    if ours_pooled is not None:
        measured["pooled"] = compared("the pooled text embedding", ours_pooled, theirs_pooled)
    return measured


def check_scheduler(pipe: Any, model: Any, family: Family) -> dict[str, float]:
    import torch
    from nemo.collections.multimodal.modules.stable_diffusion.diffusionmodules.util import make_beta_schedule

    schedule = schedule_of(model, family)
    betas = make_beta_schedule(
        schedule.beta_schedule, schedule.timesteps, schedule.beta_start, schedule.beta_end
    )
    ours = torch.cumprod(1.0 - torch.tensor(betas), dim=0)
    theirs = pipe.scheduler.alphas_cumprod.double()
    config = pipe.scheduler.config
    if (
        config.prediction_type != schedule.prediction_type
        or config.beta_schedule != DIFFUSERS_BETA_SCHEDULES.get(schedule.beta_schedule)
    ):
        raise ExportError(
            f"the scheduler: {config.beta_schedule}/{config.prediction_type} is not the trained one"
        )
    if theirs.shape != ours.shape or float((ours - theirs).abs().max()) > 1e-5:
        raise ExportError(
            "the scheduler's alphas_cumprod differ from NeMo's make_beta_schedule of the training's"
        )
    return {"max_abs_diff": float((ours - theirs).abs().max())}


def check_same_tensors(folder_pipe: Any, file_pipe: Any) -> int:
    """The single file read by diffusers gives every tensor of the pipeline folder; returns how many."""
    import torch

    count = 0
    for name, component in folder_pipe.components.items():
        if not isinstance(component, torch.nn.Module):
            continue
        theirs = file_pipe.components[name].state_dict()
        for key, tensor in component.state_dict().items():
            if key not in theirs or not torch.equal(tensor, theirs[key]):
                raise ExportError(
                    f"the single file read by diffusers: {name}.{key} differs from the folder's"
                )
            count += 1
    return count
