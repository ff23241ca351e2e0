"""A round trip Hub -> NeMo -> diffusers: a LoRA run's export (its merged pipeline folder and its adapters in
diffusers' LoRA format) less the adapters gives back the released UNet, tensor for tensor: the release loaded
into NeMo through the launcher's staging, trained with frozen base weights, merged and converted to diffusers'
names by diffusers' own converter.

    <nemo python> tests/nemo_cpu/lora_roundtrip_cpu.py EXPORT_STEP_DIR RELEASE_DIR    # prints JSON
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from safetensors.torch import load_file


def main(step_dir: Path, release: Path) -> dict[str, object]:
    merged = load_file(str(step_dir / "diffusers" / "unet" / "diffusion_pytorch_model.safetensors"))
    lora = load_file(str(step_dir / "lora" / "pytorch_lora_weights.safetensors"))
    released = load_file(str(release / "unet" / "diffusion_pytorch_model.safetensors"))
    unmerged = dict(merged)
    for key in [k for k in lora if k.endswith(".lora_A.weight")]:
        module = key.removeprefix("unet.").removesuffix(".lora_A.weight")
        b = lora[key.replace(".lora_A.", ".lora_B.")]
        unmerged[module + ".weight"] = merged[module + ".weight"] - b @ lora[key]
    differ = sorted(set(unmerged) ^ set(released))
    worst = max(
        float((unmerged[k].float() - released[k].float()).abs().max()) for k in released if k in unmerged
    )
    return {
        "tensors": len(released),
        "names_differing": differ[:5],
        "max_abs_diff": worst,
        "adapters": len(lora) // 2,
    }


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), Path(sys.argv[2]))))
