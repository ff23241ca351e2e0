"""Reads the SDXL cached-text tars with NeMo's own code and prints what it found as one JSON line.

    <nemo python> tests/nemo_cpu/sdxl_text_cache_check.py TRAINING_CONFIG.yaml CACHED_WDINFO IMAGE_TAR CACHED_TAR

1. NeMo's loader for `precache_mode: text` (stable_diffusion_dataset.py
   build_sdxl_precached_text_train_valid_datasets, in a data-parallel world of one as training builds it)
   draws one batch: its keys, shapes and dtypes.
2. For every sample of one tar: NeMo's GeneralConditioner built from the training config's conditioner
   (the captions through NeMo's CLIP and OpenCLIP embedders) and from the conditioner the switch sets
   (launcher.plugins.sdxl.text_cache.cached_conditioner: the stored tensors), caption dropout off, on the same size/crop
   inputs: the largest difference of the cross-attention and vector conditioning, and whether the `png`
   member holds the image tar's image bytes.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def _port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def draw_batch(model: object, wdinfo: str) -> dict:
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from nemo.collections.multimodal.data.stable_diffusion import stable_diffusion_dataset as sd_data
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(OmegaConf.to_container(model, resolve=True))
    cfg.data.train.dataset_path = [wdinfo]
    cfg.data.webdataset.local_root_path = str(Path(wdinfo).parent)
    cfg.data.num_workers = 1
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=_port())
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        parallel_state.initialize_model_parallel(1, 1)
        train, _ = sd_data.build_sdxl_precached_text_train_valid_datasets(cfg, consumed_samples=0)
        batch = next(iter(torch.utils.data.DataLoader(train, batch_size=int(cfg.micro_batch_size))))
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
    return {
        key: {"shape": list(value.shape), "dtype": str(value.dtype)}
        if hasattr(value, "shape")
        else {"values": sorted(set(value))}
        for key, value in batch.items()
    }


def compare(model: object, image_tar: str, cached_tar: str) -> dict:
    import numpy as np
    import torch
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from launcher.plugins.sdxl.text_cache import cached_conditioner

    def conditioner(entries: list) -> object:
        entries = OmegaConf.to_container(OmegaConf.create(entries), resolve=True)
        for entry in entries:
            entry["ucg_rate"] = 0.0  # dropout draws differ between two calls; the values must not
        target = model.conditioner_config._target_
        return instantiate({"_target_": target, "emb_models": entries})

    from_captions = conditioner(model.conditioner_config.emb_models)
    from_cache = conditioner(cached_conditioner(model))
    with tarfile.open(image_tar) as tar:
        images = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    with tarfile.open(cached_tar) as tar:
        cached = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    keys = sorted({name.split(".")[0] for name in cached})
    sizes = {
        key: torch.tensor([[64, 96]] * len(keys))
        for key in ("original_size_as_tuple", "crop_coords_top_left", "target_size_as_tuple")
    }
    stored = [pickle.loads(cached[f"{key}.pickle"]) for key in keys]
    batch = {name: torch.from_numpy(np.stack([s[name] for s in stored])) for name in stored[0]}
    captions = [images[f"{key}.txt"].decode() for key in keys]
    with torch.no_grad():
        want = from_captions({**sizes, "captions": captions})
        got = from_cache({**sizes, **batch, "captions": ["fake caption"] * len(keys)})
    return {
        "samples": len(keys),
        "member_order": [name.rsplit(".", 1)[1] for name in list(cached)[:2]],
        "png_is_the_jpg": all(cached[f"{k}.png"] == images[f"{k}.jpg"] for k in keys),
        "stored": {name: {"shape": list(a.shape), "dtype": str(a.dtype)} for name, a in stored[0].items()},
        **{
            out: {
                "shape": list(want[out].shape),
                "cached_shape": list(got[out].shape),
                "max_abs_diff": float((want[out].float() - got[out].float()).abs().max()),
                "abs_max": float(want[out].float().abs().max()),
            }
            for out in want
        },
    }


def main() -> None:
    from omegaconf import OmegaConf

    from launcher.jobs.nemo_cpu import patch_for_cpu

    patch_for_cpu()  # training's CPU patches: the size embedders move their output to the CUDA device

    config, wdinfo, image_tar, cached_tar = sys.argv[1:5]
    model = OmegaConf.load(config).model
    result = {"loader": draw_batch(model, wdinfo), **compare(model, image_tar, cached_tar)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
