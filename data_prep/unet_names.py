"""A Stable Diffusion UNet's tensor names in its three layouts, and a safetensors file rewritten into NeMo's.

- diffusers' `UNet2DConditionModel` (a released model's `unet/diffusion_pytorch_model.safetensors`);
- the original one, CompVis's and Stability's `openaimodel.UNetModel` (`model.diffusion_model.*` in a
  single-file checkpoint: what ComfyUI and A1111 read, and what diffusers' `from_single_file` converts);
- NeMo's, its `openaimodel.UNetModel` (the original modules, a few of them fused or renamed).

NeMo <-> original is a fixed rename (NeMo v2.0.0 / 2.4.1 openaimodel.py and attention.py: GroupNorm fuses
SiLU, so a ResBlock's conv is `in_layers.1`, not `.2`, and `out_layers.2`, not `.3`, and the UNet's last conv
`out.1`, not `.2`; a transformer block keeps its norms in its attention and feed-forward modules). Original <->
diffusers follows the block layout (diffusers' own `convert_ldm_unet_checkpoint` is this mapping's other
direction; tests/test_unet_names.py checks that the two agree on the real SD 1.5, SD 2.1 and SDXL configs).

NeMo's own diffusers mapping (`UNetModel._state_key_mapping`) renames `transformer_blocks.0.*` only, so an SDXL
UNet (up to 10 blocks a level) loads 42% of its parameters and trains the rest from random weights without a
word: the SDXL family stages its UNet through this module instead (`nemo_file`). Stdlib only: the assets job
runs in the data-prep venv.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data_prep.safetensors_file import METADATA, read_header, rewrite

# NeMo's name -> the original one: inside a transformer block (`transformer_blocks.<k>.`), a ResBlock's
# convs, the UNet's last conv.
_NEMO_TO_ORIGINAL = (
    (r"(\.transformer_blocks\.\d+\.)attn1\.norm\.", r"\1norm1."),
    (r"(\.transformer_blocks\.\d+\.)attn2\.norm\.", r"\1norm2."),
    (r"(\.transformer_blocks\.\d+\.)ff\.net\.0\.(weight|bias)$", r"\1norm3.\2"),
    (r"(\.transformer_blocks\.\d+\.)ff\.net\.1\.proj\.", r"\1ff.net.0.proj."),
    (r"(\.transformer_blocks\.\d+\.)ff\.net\.3\.", r"\1ff.net.2."),
    (r"\.in_layers\.1\.", ".in_layers.2."),
    (r"\.out_layers\.2\.", ".out_layers.3."),
    (r"^out\.1\.", "out.2."),
)
_ORIGINAL_TO_NEMO = (
    (r"(\.transformer_blocks\.\d+\.)norm1\.", r"\1attn1.norm."),
    (r"(\.transformer_blocks\.\d+\.)norm2\.", r"\1attn2.norm."),
    (r"(\.transformer_blocks\.\d+\.)norm3\.", r"\1ff.net.0."),
    (r"(\.transformer_blocks\.\d+\.)ff\.net\.0\.proj\.", r"\1ff.net.1.proj."),
    (r"(\.transformer_blocks\.\d+\.)ff\.net\.2\.", r"\1ff.net.3."),
    (r"\.in_layers\.2\.", ".in_layers.1."),
    (r"\.out_layers\.3\.", ".out_layers.2."),
    (r"^out\.2\.", "out.1."),
)
_RESNET = {
    "norm1.": "in_layers.0.",
    "conv1.": "in_layers.2.",
    "time_emb_proj.": "emb_layers.1.",
    "norm2.": "out_layers.0.",
    "conv2.": "out_layers.3.",
    "conv_shortcut.": "skip_connection.",
}
_TOP = {
    "conv_in.": "input_blocks.0.0.",
    "time_embedding.linear_1.": "time_embed.0.",
    "time_embedding.linear_2.": "time_embed.2.",
    "add_embedding.linear_1.": "label_emb.0.0.",
    "add_embedding.linear_2.": "label_emb.0.2.",
    "conv_norm_out.": "out.0.",
    "conv_out.": "out.2.",
}
_DIFFUSERS = re.compile(
    r"^(?P<part>down_blocks|up_blocks)\.(?P<block>\d+)\.(?P<kind>resnets|attentions|downsamplers|upsamplers)"
    r"\.(?P<index>\d+)\.(?P<rest>.+)$"
)
_MID = re.compile(r"^mid_block\.(?P<kind>resnets|attentions)\.(?P<index>\d+)\.(?P<rest>.+)$")


class UnetNamesError(Exception):
    """A tensor name this layout has no place for: the message names it."""


def nemo_to_original(key: str) -> str:
    """NeMo's name of a UNet tensor -> the original (CompVis) one.

    >>> nemo_to_original("input_blocks.1.1.transformer_blocks.3.ff.net.1.proj.weight")
    'input_blocks.1.1.transformer_blocks.3.ff.net.0.proj.weight'
    >>> nemo_to_original("output_blocks.2.0.out_layers.2.bias"), nemo_to_original("out.1.weight")
    ('output_blocks.2.0.out_layers.3.bias', 'out.2.weight')
    """
    return _renamed(key, _NEMO_TO_ORIGINAL)


def original_to_nemo(key: str) -> str:
    """The original name -> NeMo's (the inverse of nemo_to_original).

    >>> original_to_nemo("middle_block.1.transformer_blocks.0.norm3.weight")
    'middle_block.1.transformer_blocks.0.ff.net.0.weight'
    """
    return _renamed(key, _ORIGINAL_TO_NEMO)


def _renamed(key: str, renames: tuple[tuple[str, str], ...]) -> str:
    """The first rename that applies (each name has at most one place that differs)."""
    for pattern, replacement in renames:
        new, count = re.subn(pattern, replacement, key, count=1)
        if count:
            return new
    return key


@dataclass(frozen=True)
class Layout:
    """What places a diffusers UNet's blocks among the original's: resnets per down block and which up
    blocks have attention (their upsampler then sits third, not second)."""

    layers_per_block: int
    up_attention: tuple[bool, ...]

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> Layout:
        """From a diffusers UNet2DConditionModel config (its config.json)."""
        return cls(
            int(config["layers_per_block"]),
            tuple("CrossAttn" in str(kind) for kind in config["up_block_types"]),
        )


def diffusers_to_original(key: str, layout: Layout) -> str:
    """diffusers' name of a UNet tensor -> the original one.

    >>> layout = Layout(2, (False, True, True, True))
    >>> diffusers_to_original("down_blocks.1.attentions.0.transformer_blocks.0.attn2.to_k.weight", layout)
    'input_blocks.4.1.transformer_blocks.0.attn2.to_k.weight'
    >>> diffusers_to_original("up_blocks.0.upsamplers.0.conv.bias", layout)
    'output_blocks.2.1.conv.bias'
    >>> diffusers_to_original("up_blocks.1.resnets.2.conv2.weight", layout)
    'output_blocks.5.0.out_layers.3.weight'
    """
    for old, new in _TOP.items():
        if key.startswith(old):
            return new + key[len(old) :]
    per = layout.layers_per_block
    mid = _MID.match(key)
    if mid:
        slot = 1 if mid["kind"] == "attentions" else 2 * int(mid["index"])
        return f"middle_block.{slot}." + _inner(mid["kind"], mid["rest"])
    found = _DIFFUSERS.match(key)
    if not found:
        raise UnetNamesError(f"{key}: not a tensor of a diffusers UNet2DConditionModel")
    block, index, kind = int(found["block"]), int(found["index"]), found["kind"]
    if found["part"] == "down_blocks":
        if kind == "downsamplers":
            return f"input_blocks.{(block + 1) * (per + 1)}.0.op." + found["rest"].removeprefix("conv.")
        slot = 1 + block * (per + 1) + index
        return f"input_blocks.{slot}.{0 if kind == 'resnets' else 1}." + _inner(kind, found["rest"])
    if kind == "upsamplers":
        if block >= len(layout.up_attention):
            raise UnetNamesError(f"{key}: up block {block} is not in the config's up_block_types")
        return f"output_blocks.{block * (per + 1) + per}.{2 if layout.up_attention[block] else 1}.{found['rest']}"
    slot = block * (per + 1) + index
    return f"output_blocks.{slot}.{0 if kind == 'resnets' else 1}." + _inner(kind, found["rest"])


def _inner(kind: str, rest: str) -> str:
    if kind != "resnets":
        return rest  # an attention block's names are the same in both (diffusers' converter keeps them)
    for old, new in _RESNET.items():
        if rest.startswith(old):
            return new + rest[len(old) :]
    raise UnetNamesError(f"{rest}: not a tensor of a diffusers ResnetBlock2D")


def diffusers_to_nemo(key: str, layout: Layout) -> str:
    return original_to_nemo(diffusers_to_original(key, layout))


def nemo_file(source: Path, target: Path, config: Mapping[str, Any]) -> int:
    """Write `target` (atomically): the diffusers UNet file `source` (safetensors) with every tensor under
    NeMo's name and the same bytes, for NeMo's `from_pretrained` with `from_NeMo: true`; returns how many
    tensors it holds. `config` is the UNet's diffusers config (unet/config.json)."""
    layout = Layout.of(config)
    header, _ = read_header(source)
    rewrite(source, target, lambda key, info: (diffusers_to_nemo(key, layout), info))
    return sum(key != METADATA for key in header)


def nemo_args(config: Mapping[str, Any]) -> dict[str, Any]:
    """The NeMo UNetModel arguments (unet_config) that build the UNet a diffusers config describes: those
    that fix its tensors' shapes, and its attention heads per level (`heads`, which fix none but change
    every output).

    >>> sd15 = {"block_out_channels": [320, 640, 1280, 1280], "layers_per_block": 2, "cross_attention_dim": 768,
    ...         "down_block_types": ["CrossAttnDownBlock2D"] * 3 + ["DownBlock2D"], "attention_head_dim": 8}
    >>> args = nemo_args(sd15)
    >>> args["channel_mult"], args["attention_resolutions"], args["heads"]
    ([1, 2, 4, 4], [1, 2, 4], [8, 8, 8, None])
    """
    channels = [int(c) for c in config["block_out_channels"]]
    attention = ["CrossAttn" in str(kind) for kind in config["down_block_types"]]
    heads = config.get("num_attention_heads") or config.get("attention_head_dim", 8)  # diffusers' legacy name
    depth = config.get("transformer_layers_per_block", 1)
    per_level = lambda value: list(value) if isinstance(value, (list, tuple)) else [value] * len(channels)  # noqa: E731
    return {
        "in_channels": int(config.get("in_channels", 4)),
        "out_channels": int(config.get("out_channels", 4)),
        "model_channels": channels[0],
        "channel_mult": [c // channels[0] for c in channels],
        "num_res_blocks": int(config["layers_per_block"]),
        "attention_resolutions": [2**level for level, on in enumerate(attention) if on],
        "context_dim": config.get("cross_attention_dim"),
        "use_linear_in_transformer": bool(config.get("use_linear_projection", False)),
        "transformer_depth": [d if on else None for d, on in zip(per_level(depth), attention, strict=True)],
        "adm_in_channels": config.get("projection_class_embeddings_input_dim"),
        "heads": [h if on else None for h, on in zip(per_level(heads), attention, strict=True)],
    }


# NeMo's UNetModel defaults (openaimodel.py, v2.0.0) of the arguments preset_args reads.
_NEMO_DEFAULTS: dict[str, Any] = {
    "in_channels": None,
    "out_channels": None,
    "model_channels": None,
    "num_res_blocks": None,
    "attention_resolutions": [],
    "channel_mult": [1, 2, 4, 8],
    "num_heads": -1,
    "num_head_channels": -1,
    "transformer_depth": 1,
    "context_dim": None,
    "use_linear_in_transformer": False,
    "adm_in_channels": None,
}


def preset_args(unet: Mapping[str, Any]) -> dict[str, Any]:
    """A NeMo unet_config in nemo_args's form (NeMo's defaults filled in).

    >>> preset_args({"model_channels": 32, "channel_mult": [1, 2], "num_res_blocks": 2, "attention_resolutions": [1],
    ...              "num_heads": 2, "context_dim": 32, "in_channels": 4, "out_channels": 4})["heads"]
    [2, None]
    """
    given = {key: unet.get(key, default) for key, default in _NEMO_DEFAULTS.items()}
    mult = [int(m) for m in given["channel_mult"]]
    resolutions = sorted(int(r) for r in given["attention_resolutions"])
    attention = [2**level in resolutions for level in range(len(mult))]
    depth = given["transformer_depth"]  # an int, or one per level (a list, or OmegaConf's ListConfig)
    depths = [depth] * len(mult) if isinstance(depth, int) else list(depth)
    channels = [int(given["model_channels"] or 0) * m for m in mult]
    head_channels, heads = int(given["num_head_channels"]), int(given["num_heads"])
    per_level = [c // head_channels if head_channels > 0 else heads for c in channels]
    context = given["context_dim"]
    context = context if context is None or isinstance(context, int) else next(iter(context))
    return {
        "in_channels": given["in_channels"],
        "out_channels": given["out_channels"],
        "model_channels": given["model_channels"],
        "channel_mult": mult,
        "num_res_blocks": given["num_res_blocks"],
        "attention_resolutions": resolutions,
        "context_dim": context,
        "use_linear_in_transformer": bool(given["use_linear_in_transformer"]),
        "transformer_depth": [d if on else None for d, on in zip(depths, attention, strict=True)],
        "adm_in_channels": given["adm_in_channels"],
        "heads": [h if on else None for h, on in zip(per_level, attention, strict=True)],
    }


def unet_differences(theirs: Mapping[str, Any], unet: Mapping[str, Any]) -> list[str]:
    """Where a UNet described by nemo_args (a release's config) and a NeMo unet_config differ, as
    `key <theirs> there, <ours> here` (`heads`: NeMo's num_heads, or the width over num_head_channels).

    >>> sd15 = {"block_out_channels": [32, 64], "layers_per_block": 2, "cross_attention_dim": 32,
    ...         "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"], "attention_head_dim": 2}
    >>> unet_differences(nemo_args(sd15), {"model_channels": 32, "channel_mult": [1, 2], "num_res_blocks": 1,
    ...     "attention_resolutions": [1], "num_heads": 2, "context_dim": 32, "in_channels": 4, "out_channels": 4})
    ['num_res_blocks 2 there, 1 here']
    """
    ours = preset_args(unet)
    return [f"{key} {theirs[key]} there, {ours[key]} here" for key in theirs if theirs[key] != ours[key]]
