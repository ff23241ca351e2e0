"""NeMo's FID image generation (`.../stable_diffusion/generate_fid_images.py`) on CPU, for tests: same CLI.

    <nemo python> tests/nemo_cpu/generate_fid_cpu.py --config-path DIR --config-name generate.yaml

Not in NeMo's wheel. With NEMO_SD_FID_IMAGES=<path to that file> this runs it as is; without,
`generate_fid_main()` makes the same calls (v2.0.0 and v2.4.0 are identical): the guidance scale of
SLURM_ARRAY_TASK_ID // fid.nnodes_per_cfg, the first fid.num_images_to_eval caption files (sorted,
readlines), this task's share by node and fid.local_task_id (else SLURM_LOCALID), the same
model_cfg_modifier, `setup_trainer_and_model_for_inference`, a generator seeded with
infer.seed + local task x 10 + node x 100, NeMo's `pipeline`, images saved as image<n:06d>.png.
CUDA-only calls replaced: those of sd_infer_cpu.patch_infer_for_cpu.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sd_infer_cpu import inference_model_cfg, patch_infer_for_cpu
from sd_train_cpu import run_hydra_entry


def _share(items: list[str], parts: int, index: int) -> tuple[int, list[str]]:
    """generate_fid_images.py's split: equal parts, the last one taking the remainder."""
    size = len(items) // parts
    end = (index + 1) * size if index != parts - 1 else None
    return size, items[index * size : end]


def generate_fid_main(cfg: Any) -> None:
    import torch
    from nemo.collections.multimodal.models.text_to_image.stable_diffusion.ldm.ddpm import (
        MegatronLatentDiffusion,
    )
    from nemo.collections.multimodal.parts.stable_diffusion.pipeline import pipeline
    from nemo.collections.multimodal.parts.utils import setup_trainer_and_model_for_inference
    from omegaconf import open_dict

    fid = cfg.fid
    node_id = int(os.environ.get("SLURM_ARRAY_TASK_ID", 0))
    node_id_per_cfg = node_id % fid.nnodes_per_cfg
    scale = fid.classifier_free_guidance[node_id // fid.nnodes_per_cfg]
    with open_dict(cfg):
        cfg.infer.unconditional_guidance_scale = scale
    save_path = os.path.join(fid.save_path, str(scale))
    captions: list[str] = []
    files = sorted(os.listdir(fid.coco_captions_path))
    assert len(files) >= fid.num_images_to_eval
    for name in files[: fid.num_images_to_eval]:
        with open(os.path.join(fid.coco_captions_path, name)) as handle:
            captions += handle.readlines()
    per_node, captions = _share(captions, fid.nnodes_per_cfg, node_id_per_cfg)
    local = (
        int(fid.local_task_id) if fid.local_task_id is not None else int(os.environ.get("SLURM_LOCALID", 0))
    )
    per_task, prompts = _share(captions, fid.ntasks_per_node, local)
    os.makedirs(save_path, exist_ok=True)

    def model_cfg_modifier(model_cfg: Any) -> None:
        inference_model_cfg(model_cfg, cfg.trainer.precision)
        model_cfg.global_batch_size = cfg.infer.batch_size * fid.ntasks_per_node

    _trainer, megatron_diffusion_model = setup_trainer_and_model_for_inference(
        model_provider=MegatronLatentDiffusion, cfg=cfg, model_cfg_modifier=model_cfg_modifier
    )
    model = megatron_diffusion_model.model
    model.cuda().eval()
    cfg.infer.prompts = prompts
    rng = torch.Generator().manual_seed(cfg.infer.seed + local * 10 + node_id_per_cfg * 100)
    output = pipeline(model, cfg, rng=rng)
    for i, image in enumerate(img for batch in output for img in batch):
        image.save(
            os.path.join(save_path, f"image{i + per_node * node_id_per_cfg + per_task * local:06d}.png")
        )


def main() -> None:
    run_hydra_entry(
        "generate_fid_cpu", patch_infer_for_cpu(), "NEMO_SD_FID_IMAGES", "sd_fid_images", generate_fid_main
    )


if __name__ == "__main__":
    main()
