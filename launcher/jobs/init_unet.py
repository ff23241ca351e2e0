"""training.init_from's job: the UNet-only state dict of a NeMo checkpoint, for unet_config.from_pretrained.

    python -m launcher.jobs.init_unet SOURCE OUT

SOURCE is a NeMo training .ckpt, or an earlier run folder: its newest finished checkpoint when this job
starts (the -EMA twin when that run kept EMA weights). OUT gets `{'state_dict': ...}` with only the
`model.model.diffusion_model.*` tensors (NeMo strips that prefix and, with from_NeMo, loads them with no
missing and no unexpected key), and OUT.source names the checkpoint it came from. Needs torch only (it
runs with NeMo's interpreter); the checkpoint is memory-mapped, so only the UNet is read into memory.
"""

from __future__ import annotations

import sys
from pathlib import Path

from data_prep.atomic import atomic_path, write_atomic
from launcher.init_from import UNET_PREFIX, checkpoint_of
from launcher.outputs import TrainingOutputs


def main(argv: list[str]) -> int:
    import torch

    source, out = Path(argv[0]), Path(argv[1])
    checkpoint = checkpoint_of(source)
    # Lightning's checkpoints hold the hyper-parameters as OmegaConf objects: not weights_only.
    state = torch.load(checkpoint, map_location="cpu", mmap=True, weights_only=False)["state_dict"]
    unet = {key: value for key, value in state.items() if key.startswith(UNET_PREFIX)}
    if not unet:
        raise SystemExit(f"init_from: {checkpoint} holds no {UNET_PREFIX}* tensors: not a NeMo SD checkpoint")
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp:
        torch.save({"state_dict": unet}, tmp)
    write_atomic(TrainingOutputs.source_of(out), f"{checkpoint}\n")
    print(f"init_from: {len(unet)} UNet tensors of {checkpoint} -> {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
