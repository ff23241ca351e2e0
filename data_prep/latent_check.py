"""data_check's part for cached latents (data_preparation.precache, data_prep.encode_latents).

The tars must hold one `<key>.pickle` member per sample, the wdinfo must count them exactly, and what
NeMo's own precached loader (build_train_valid_precached_datasets) yields must have the shapes and the
dtype the training config implies: moments [batch, 2 x embed_dim, H/8, W/8] and text embeddings
[batch, max_length padded to 8, context_dim], stored float16 (data_prep.latent_format).
"""

from __future__ import annotations

from typing import Any

from data_prep.latent_format import MEMBER_EXT, STORED_DTYPE, sample_shapes

TORCH_DTYPE = {"<f2": "torch.float16"}[STORED_DTYPE]


def check_latent_members(scan: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Errors and warnings from one latent tar's member extensions."""
    path, found = scan["path"], set(scan["extensions"])
    if scan["pickle_samples"] == 0:
        return [
            f"{path}: no .{MEMBER_EXT} members (found {sorted(found)}): the training config reads cached "
            "latents (first_stage_key ends in 'encoded') but these are not latent tars; set "
            "data_preparation.precache.enable to match the data, or rerun the encode step"
        ], []
    partial = scan["keys"] - scan["pickle_samples"]
    return [], [f"{path}: {partial} of {scan['keys']} keys lack a .{MEMBER_EXT} member"] if partial else []


def count_errors(scans: list[dict[str, Any]], total: int, listed: int, latent: bool) -> list[str]:
    """With every listed latent tar scanned: their samples must add up to the wdinfo's total_key_count."""
    if not latent or len(scans) != listed:
        return []
    found = sum(scan["pickle_samples"] for scan in scans)
    if found == total:
        return []
    return [
        f"the {listed} latent tars hold {found} samples but their wdinfo says total_key_count {total}; "
        "rerun `python -m data_prep.encode_latents wdinfo`"
    ]


def loader_errors(result: dict[str, Any], model: Any, mbs: int) -> list[str]:
    """The first batch NeMo's precached loader drew, against the shapes the training config implies."""
    if not result.get("batches_drawn"):
        return []
    moments, text = sample_shapes(model)
    wanted = {
        "images": ([mbs, *moments], f"model.first_stage_key ({model.first_stage_key})"),
        "captions": ([mbs, *text], f"model.cond_stage_key ({model.cond_stage_key})"),
    }
    errors = []
    for name, (shape, key) in wanted.items():
        got, dtype = result.get(name), result.get(f"{name}_dtype")
        if got != shape:
            errors.append(
                f"{key}: NeMo's precached loader yields {got} but this training config needs {shape} "
                "(crop, VAE embed_dim, text max_length, unet_config.context_dim): re-encode with this config"
            )
        if dtype != TORCH_DTYPE:
            errors.append(
                f"{key}: NeMo's precached loader yields {dtype}; the encode step stores {TORCH_DTYPE}"
            )
    return errors
