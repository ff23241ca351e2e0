"""What fixes the tensor shapes of NeMo's Stable Diffusion UNet (SD 1.x/2.0 and SDXL: one UNetModel): its
shape-giving arguments, and the shapes they give a few of its tensors. Data and pure functions:
training.init_from compares an earlier run's UNet with this preset's (launcher.stages.training_init), and a
run folder's record of its training holds them (launcher.stages.training_record).

>>> unet_tensors(unet_shape({"unet_config": {"in_channels": 4, "out_channels": 4, "model_channels": 32}}))
{'time_embed.0.weight': (128, 32), 'input_blocks.0.0.weight': (32, 4, 3, 3), 'out.1.weight': (4, 32, 3, 3)}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# NeMo's UNetModel arguments that change a parameter's shape or the set of parameters, with NeMo's
# defaults (openaimodel.py); heads, flash attention and precision do not.
UNET_SHAPE_ARGS: dict[str, Any] = {
    "in_channels": None,
    "out_channels": None,
    "model_channels": None,
    "num_res_blocks": None,
    "attention_resolutions": None,
    "channel_mult": [1, 2, 4, 8],
    "conv_resample": True,
    "dims": 2,
    "num_classes": None,
    "use_scale_shift_norm": False,
    "resblock_updown": False,
    "use_spatial_transformer": False,
    "transformer_depth": 1,
    "transformer_depth_middle": None,
    "context_dim": None,
    "n_embed": None,
    "use_linear_in_transformer": False,
    "adm_in_channels": None,
    "num_attention_blocks": None,
    "disable_self_attentions": None,
    "disable_middle_self_attn": False,
}


def unet_shape(model: Mapping[str, Any]) -> dict[str, Any]:
    """The shape-giving arguments of a NeMo `model` section's unet_config, NeMo's defaults filled in."""
    unet = model.get("unet_config") or {}
    return {
        key: list(value) if isinstance(value, (list, tuple)) else value
        for key, default in UNET_SHAPE_ARGS.items()
        for value in [unet.get(key, default)]
    }


def differences(theirs: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    """Where two unet_shape results differ, as `key <theirs> there, <ours> here`."""
    return [
        f"{key} {theirs[key]} there, {ours[key]} here" for key in UNET_SHAPE_ARGS if theirs[key] != ours[key]
    ]


def unet_tensors(shape: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Shapes that NeMo's UNetModel (openaimodel.py) gives a few of its tensors, from unet_shape's
    arguments: the time embedding, the first and the last convolution, and SDXL's vector conditioning
    input (num_classes "sequential": adm_in_channels). Empty for a UNet not in 2-D or with its channels
    unset (nothing to compare)."""
    width, given, made = shape["model_channels"], shape["in_channels"], shape["out_channels"]
    if shape["dims"] != 2 or not all(isinstance(n, int) for n in (width, given, made)):
        return {}
    tensors = {
        "time_embed.0.weight": (4 * width, width),
        "input_blocks.0.0.weight": (width, given, 3, 3),
        "out.1.weight": (made, width, 3, 3),
    }
    if shape["num_classes"] == "sequential" and isinstance(shape["adm_in_channels"], int):
        tensors["label_emb.0.0.weight"] = (4 * width, shape["adm_in_channels"])
    return tensors


def _block_counts(shape: dict[str, Any]) -> dict[str, int]:
    """How many input and output blocks the UNet has: the first convolution, num_res_blocks per level and
    a downsampling block between levels in; num_res_blocks + 1 per level out."""
    levels, per_level = shape["channel_mult"], shape["num_res_blocks"]
    if not isinstance(levels, list) or per_level is None:
        return {}
    blocks = per_level if isinstance(per_level, list) else [per_level] * len(levels)
    return {"input_blocks": 1 + sum(blocks) + len(levels) - 1, "output_blocks": sum(n + 1 for n in blocks)}


def _per_level(value: Any, levels: int) -> list[Any]:
    return list(value) if isinstance(value, list) else [value] * levels


def transformer_depths(shape: dict[str, Any]) -> dict[str, int]:
    """The transformer blocks of each spatial transformer, by its module name, as UNetModel builds them
    (transformer_depth per level, transformer_depth_middle, attention_resolutions, num_attention_blocks).

    >>> transformer_depths(unet_shape({"unet_config": {"channel_mult": [1, 2], "num_res_blocks": 1,
    ...     "attention_resolutions": [2], "use_spatial_transformer": True, "transformer_depth": [1, 3]}}))
    {'input_blocks.3.1': 3, 'middle_block.1': 3, 'output_blocks.0.1': 3, 'output_blocks.1.1': 3}
    """
    mult, per_level, resolutions = (
        shape["channel_mult"],
        shape["num_res_blocks"],
        shape["attention_resolutions"],
    )
    if not shape["use_spatial_transformer"] or not isinstance(mult, list) or None in (per_level, resolutions):
        return {}
    blocks = _per_level(per_level, len(mult))
    depths = _per_level(shape["transformer_depth"], len(mult))
    limits = shape["num_attention_blocks"]

    def attends(level: int, n: int, ds: int) -> bool:
        return ds in resolutions and (limits is None or n < limits[level])

    found, index, ds = {}, 1, 1
    for level in range(len(mult)):
        for n in range(blocks[level]):
            if attends(level, n, ds):
                found[f"input_blocks.{index}.1"] = depths[level]
            index += 1
        if level != len(mult) - 1:
            index, ds = index + 1, ds * 2
    found["middle_block.1"] = shape["transformer_depth_middle"] or depths[-1]
    index = 0
    for level in reversed(range(len(mult))):
        for n in range(blocks[level] + 1):
            if attends(level, n, ds):
                found[f"output_blocks.{index}.1"] = depths[level]
            index += 1
        ds //= 2 if level else 1
    return found


def tensor_problems(tensors: dict[str, tuple[int, ...]], shape: dict[str, Any]) -> list[str]:
    """What in a checkpoint's UNet tensors (names less UNET_PREFIX) contradicts the UNet `shape` builds."""
    found = [
        f"{name} {list(tensors[name]) if name in tensors else 'missing'}, {list(wanted)} here"
        for name, wanted in unet_tensors(shape).items()
        if tensors.get(name) != wanted
    ]
    for kind, wanted in _block_counts(shape).items():
        have = len({name.split(".")[1] for name in tensors if name.startswith(f"{kind}.")})
        if have != wanted:
            found.append(f"{have} {kind}, {wanted} here")
    for block, depth in transformer_depths(shape).items():
        prefix = f"{block}.transformer_blocks."
        have = len({name[len(prefix) :].split(".")[0] for name in tensors if name.startswith(prefix)})
        if have != depth:
            found.append(f"{have} transformer blocks in {block}, {depth} here")
    context = shape["context_dim"]
    if shape["use_spatial_transformer"] and isinstance(context, int):
        keys = [name for name, dims in tensors.items() if name.endswith("attn2.to_k.weight")]
        if not keys or any(tensors[name][-1] != context for name in keys):
            found.append(
                f"cross-attention keys {sorted({tensors[n][-1] for n in keys})}, context_dim {context} here"
            )
    return found
