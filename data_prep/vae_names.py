"""A diffusers VAE file rewritten, once at staging, into the key names NeMo 2.4's AutoencoderKL reads.

NeMo's `AutoencoderKL._state_key_mapping` (nemo/collections/multimodal/models/text_to_image/
stable_diffusion/ldm/autoencoder.py, v2.4.0) renames diffusers' keys to its own but knows only the middle
attention's names that diffusers wrote before 0.15 (`query`, `key`, `value`, `proj_attn`; `group_norm` is
the same in both). Current diffusers writes `to_q`, `to_k`, `to_v`, `to_out.0` (the SDXL VAE on the Hub
does): NeMo then loads with 16 keys missing and 16 unexpected, leaves the encoder's and decoder's middle
attention random and only prints it. Here those names become the old ones, and their Linear weights
[C, C] NeMo's 1x1-conv shape [C, C, 1, 1] (NeMo reshapes them itself only when C is 512, the real width,
so the tiny test VAEs need it too; the bytes are the same). Every other key is left to NeMo's mapping.

Works on the safetensors header alone (data_prep/safetensors_file.py): no torch, any dtype. Stdlib only:
the assets job runs in the data-prep venv.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from data_prep.safetensors_file import rewrite

# Current diffusers' attention names -> the pre-0.15 ones NeMo's mapping reads, in the VAE's mid block.
_ATTENTION = {"to_q": "query", "to_k": "key", "to_v": "value", "to_out.0": "proj_attn"}
_CURRENT = re.compile(
    r"^(?P<head>(?:encoder|decoder)\.mid_block\.attentions\.\d+\.)(?P<name>to_q|to_k|to_v|to_out\.0)"
    r"\.(?P<kind>weight|bias)$"
)


def nemo_readable(key: str, info: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """One tensor's name and header entry as NeMo's mapping reads them (unchanged unless current diffusers').

    >>> nemo_readable("decoder.mid_block.attentions.0.to_out.0.weight", {"shape": [512, 512]})
    ('decoder.mid_block.attentions.0.proj_attn.weight', {'shape': [512, 512, 1, 1]})
    >>> nemo_readable("encoder.conv_in.bias", {"shape": [128]})
    ('encoder.conv_in.bias', {'shape': [128]})
    """
    match = _CURRENT.match(key)
    if not match:
        return key, info
    new = {**info}
    if match["kind"] == "weight" and len(info["shape"]) == 2:
        new["shape"] = [*info["shape"], 1, 1]
    return f"{match['head']}{_ATTENTION[match['name']]}.{match['kind']}", new


def convert(source: Path, target: Path) -> int:
    """Write `target` (atomically): `source` with its keys as NeMo reads them; returns how many were renamed."""
    return rewrite(source, target, nemo_readable)
