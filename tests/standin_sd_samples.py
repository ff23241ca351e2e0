"""STAND-IN for NeMo's convert_ckpt_to_nemo.py, sd_infer.py, generate_fid_images.py and sd_xl_infer.py:
converts and samples nothing, so the real samples and evaluation jobs can run on a CPU-only test cluster.

Called with conversion's arguments (`--checkpoint_folder ... --nemo_file_path OUT`) it writes a fake OUT;
called with sd_infer's (`--config-path DIR --config-name NAME`) it writes, as NeMo's pipeline names them,
`<prompt[:50]>_<i>.png` for every prompt and image, each a flat colour of the config's height x width;
with generate_fid_images' config (a `fid` section), `<save_path>/<scale>/image<n:06d>.png` for its task's
share of the captions (scale by SLURM_ARRAY_TASK_ID, share by fid.local_task_id of fid.ntasks_per_node);
with sd_xl_infer's (a `sampling` section), `{n:09}.png` in out_path for every prompt i and sample, n counted
on from the files already there, each a flat colour whose red and green are NeMo's seed for it
(`infer.seed + 100 i + 200 batch`) in base 256.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import yaml
from PIL import Image


def convert(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    for name in (
        "--checkpoint_folder",
        "--checkpoint_name",
        "--hparams_file",
        "--nemo_file_path",
        "--model_type",
    ):
        parser.add_argument(name, required=True)
    args = parser.parse_args(argv)
    assert (Path(args.checkpoint_folder) / args.checkpoint_name).is_file() and Path(
        args.hparams_file
    ).is_file()
    Path(args.nemo_file_path).write_text(f"fake .nemo of {args.checkpoint_name} (stand-in)\n")
    print(f"standin convert {args.checkpoint_name}", flush=True)


def fid_images(fid: dict, infer: dict) -> None:
    scale = fid["classifier_free_guidance"][int(os.environ.get("SLURM_ARRAY_TASK_ID", "0"))]
    tasks, local = fid["ntasks_per_node"], int(fid["local_task_id"])
    per_task = fid["num_images_to_eval"] // tasks
    end = (local + 1) * per_task if local != tasks - 1 else fid["num_images_to_eval"]
    out = Path(fid["save_path"]) / str(scale)
    out.mkdir(parents=True, exist_ok=True)
    for n in range(local * per_task, end):
        colour = (int(scale * 30) % 256, 7 * n % 256, 90)
        Image.new("RGB", (infer["width"], infer["height"]), colour).save(out / f"image{n:06d}.png")
    print(f"standin generate scale {scale}: images {local * per_task}..{end - 1}", flush=True)


def xl_images(config: dict) -> None:
    cfg, base, out = config["infer"], config["sampling"]["base"], Path(config["out_path"])
    out.mkdir(parents=True, exist_ok=True)
    count = len(list(out.iterdir()))  # perform_save_locally's numbering
    per_batch = cfg["num_samples_per_batch"]
    for i, _prompt in enumerate(cfg["prompt"]):
        for batch in range(cfg["num_samples"] // per_batch):
            seed = cfg["seed"] + i * 100 + batch * 200
            for _ in range(per_batch):
                colour = (seed % 256, seed // 256 % 256, 0)
                Image.new("RGB", (base["width"], base["height"]), colour).save(out / f"{count:09}.png")
                count += 1
    print(f"standin sd_xl_infer {len(cfg['prompt'])} prompt(s) at scale {base['scale']}", flush=True)


def infer(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config-path", required=True)
    parser.add_argument("--config-name", required=True)
    args = parser.parse_args(argv)
    config = yaml.safe_load((Path(args.config_path) / args.config_name).read_text())
    if "fid" in config:
        fid_images(config["fid"], config["infer"])
        return
    if "sampling" in config:
        xl_images(config)
        return
    cfg = config["infer"]
    out = Path(cfg["out_path"])
    out.mkdir(parents=True, exist_ok=True)
    for n, prompt in enumerate(cfg["prompts"]):
        for i in range(cfg["num_images_per_prompt"]):
            colour = (40 * n % 256, 80 * i % 256, 128)
            Image.new("RGB", (cfg["width"], cfg["height"]), colour).save(out / f"{prompt[:50]}_{i}.png")
    print(f"standin infer {len(cfg['prompts'])} prompt(s) at {cfg['height']}x{cfg['width']}", flush=True)


if __name__ == "__main__":
    (convert if "--nemo_file_path" in sys.argv else infer)(sys.argv[1:])
