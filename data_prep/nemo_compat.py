"""Lets NeMo's Stable Diffusion modules be BUILT where apex is absent (the CPU venv of data_check).

NeMo's SD modules take `GroupNorm` from apex (`apex.contrib.group_norm`, a fused CUDA kernel that
can also apply SiLU); without apex the name is simply undefined and building a UNet or VAE raises
NameError. Importing this module defines it as `torch.nn.GroupNorm` followed by the optional SiLU:
the same parameters under the same names, so state dicts and key checks are unchanged. Where apex
is installed (NVIDIA's container) nothing is touched.
"""

from __future__ import annotations

import importlib

import torch

_NEMO_SD = "nemo.collections.multimodal.modules.stable_diffusion"
MODULES_USING_APEX_GROUP_NORM = (
    f"{_NEMO_SD}.diffusionmodules.util",
    f"{_NEMO_SD}.diffusionmodules.model",
    f"{_NEMO_SD}.diffusionmodules.openaimodel",
    f"{_NEMO_SD}.attention",
)


class GroupNorm(torch.nn.GroupNorm):
    """apex.contrib.group_norm.GroupNorm's signature: act="silu" applies SiLU after the norm."""

    def __init__(
        self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True, act: str = ""
    ) -> None:
        super().__init__(num_groups, num_channels, eps=eps, affine=affine)
        if act not in ("", "silu"):
            raise ValueError(f"act={act!r}: apex's GroupNorm supports '' and 'silu'")
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        return torch.nn.functional.silu(y) if self.act == "silu" else y


def install(replace_apex: bool = False) -> list[str]:
    """Define GroupNorm in each NeMo SD module that lacks it (with `replace_apex`, also where apex's is
    there: a run on CPU inside NVIDIA's container, where apex's fused kernel needs CUDA); returns the
    modules changed."""
    changed = []
    for name in MODULES_USING_APEX_GROUP_NORM:
        module = importlib.import_module(name)
        if replace_apex or not hasattr(module, "GroupNorm"):
            module.GroupNorm = GroupNorm  # type: ignore[attr-defined]
            changed.append(name)
    return changed


install()
