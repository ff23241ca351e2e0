"""The config key behind a shape mismatch NeMo's training raised in the rehearsal.

Torch names no key: a text encoder whose embeddings are not the UNet's cross-attention width fails as
`mat1 and mat2 shapes cannot be multiplied (80x64 and 768x32)` (F.linear: the input is tokens x 64, the
attention's to_k weight, transposed, is 768 x 32), and latents with other channels than the UNet takes
fail in its first convolution. The width the UNet expected is matched against the keys of
`training.model.unet_config` that set it, so the line can say which key disagrees with what:

    >>> unet = {"context_dim": 768, "in_channels": 4, "adm_in_channels": 2816}
    >>> found = suspect("mat1 and mat2 shapes cannot be multiplied (80x64 and 768x32)", unet)
    >>> found.split(": ")[0], found.split("; ")[1]
    ('training.model.unet_config.context_dim', 'set context_dim=64 or stage the text encoder that gives 768')
"""

from __future__ import annotations

import re
from typing import Any

_MATMUL = re.compile(r"mat1 and mat2 shapes cannot be multiplied \((\d+)x(\d+) and (\d+)x(\d+)\)")
# F.conv2d: "... weight of size [32, 4, 3, 3], expected input[1, 8, 32, 32] to have 4 channels, but got 8 ..."
_CONV = re.compile(r"expected input\[[^\]]*\] to have (\d+) channels, but got (\d+) channels")

# unet_config key -> (what it is the width of, what gives the input, the way out for a given width `{}`)
_WIDTHS = {
    "context_dim": (
        "cross-attention takes {e}-wide text embeddings",
        "the text encoder gives {g}",
        "set context_dim={g} or stage the text encoder that gives {e}",
    ),
    "adm_in_channels": (
        "vector conditioning takes {e} values",
        "the conditioner's embedders give {g}",
        "set adm_in_channels={g} or change the conditioner's embedders to give {e}",
    ),
    "in_channels": (
        "first convolution takes {e} channels",
        "the latents (the VAE's embed_dim, model.channels) have {g}",
        "set in_channels={g} or use the VAE whose latents have {e}",
    ),
}


def suspect(error: str, unet_config: dict[str, Any]) -> str | None:
    """The key of `training.model.unet_config` that most likely caused torch's shape `error`, with the two
    widths and a way out, or None when the error is no shape mismatch or no key has the expected width."""
    if found := _MATMUL.search(error):
        given, expected, keys = int(found[2]), int(found[3]), ("context_dim", "adm_in_channels")
    elif found := _CONV.search(error):
        expected, given, keys = int(found[1]), int(found[2]), ("in_channels",)
    else:
        return None
    for key in keys:
        if unet_config.get(key) == expected and given != expected:
            takes, gives, way_out = (text.format(e=expected, g=given) for text in _WIDTHS[key])
            return f"training.model.unet_config.{key}: the UNet's {takes}, {gives}; {way_out}"
    return None
