"""NeMo SD data loader throughput on this CPU vs what one GPU consumes: how many loader workers a GPU needs.

Builds a demo-size webdataset set of 256x256 JPEGs (--side to change) (smooth synthetic pictures, so that JPEG sizes and
decode cost are near those of photos, not of noise), then runs `python -m data_prep.data_check` with
NeMo's own loader at 1 and 2 workers and reads images/s from its JSON report. Run with the NeMo venv:

    .venv-nemo/bin/python benchmarks/bench_data_check.py [--tars 8] [--per-tar 128] [--mbs 32]
        [--workers 1 2] [--side 256]
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import webdataset as wds
from omegaconf import OmegaConf
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
# NVIDIA launcher README (NeMo Multimodal 23.03): SD res 256, MBS 128, ~219 img/s per H100; our own
# diffusers step on one H100 reached ~270 img/s with torch.compile (shared/notes/nemo-sd-contract.md).
GPU_IMAGES_PER_S = {"H100 (NVIDIA figure)": 219.0, "H100 (compiled, measured)": 270.0, "A100 (NVIDIA)": 106.0}


def photo_like_jpeg(rng: np.random.Generator, side: int = 256) -> bytes:
    """A smooth random picture (upsampled 8x8 colours plus mild grain) saved as quality-90 JPEG."""
    coarse = Image.fromarray(rng.integers(0, 256, size=(8, 8, 3), dtype=np.uint8))
    pixels = np.asarray(coarse.resize((side, side), Image.Resampling.BICUBIC), dtype=np.int16)
    pixels = np.clip(pixels + rng.integers(-6, 7, size=pixels.shape), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


def build_set(root: Path, tars: int, per_tar: int, side: int) -> tuple[Path, float]:
    """Tars + wdinfo.pkl under root; returns the wdinfo path and the mean JPEG size in KiB."""
    rng = np.random.default_rng(1)
    (root / "shards").mkdir()
    names, sizes = [], []
    for t in range(tars):
        names.append(f"{t:05d}.tar")
        with wds.TarWriter(str(root / "shards" / names[-1])) as sink:
            for i in range(per_tar):
                jpg = photo_like_jpeg(rng, side)
                sizes.append(len(jpg))
                sink.write({"__key__": f"{t:05d}{i:04d}", "jpg": jpg, "txt": f"picture {t} {i}"})
    wdinfo = root / "wdinfo.pkl"
    wdinfo.write_bytes(
        pickle.dumps({"tar_files": names, "chunk_size": per_tar, "total_key_count": tars * per_tar})
    )
    return wdinfo, sum(sizes) / len(sizes) / 1024


def write_config(root: Path, wdinfo: Path, mbs: int) -> Path:
    """The 860M res-256 preset's data section (augmentations, sampler) pointing at the demo set."""
    cfg = {
        "trainer": {"devices": 1, "num_nodes": 1},
        "model": {
            "first_stage_key": "images",
            "cond_stage_key": "captions",
            "micro_batch_size": mbs,
            "data": {
                "num_workers": 1,
                "synthetic_data": False,
                "train": {
                    "dataset_path": [str(wdinfo)],
                    "augmentations": {
                        "resize_smallest_side": 256,
                        "center_crop_h_w": "256, 256",
                        "horizontal_flip": False,
                    },
                },
                "webdataset": {"infinite_sampler": False, "local_root_path": str(root / "shards")},
            },
        },
    }
    path = root / "train.yaml"
    OmegaConf.save(OmegaConf.create(cfg), path)
    return path


def measure(config: Path, workers: int, batches: int, report: Path) -> dict[str, float]:
    """One data_check run in a fresh process; its loader section."""
    cmd = [
        sys.executable,
        "-m",
        "data_prep.data_check",
        "--training-config",
        str(config),
        "--num-workers",
        str(workers),
        "--batches",
        str(batches),
        "--report",
        str(report),
    ]
    proc = subprocess.run(
        cmd,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode:
        raise SystemExit(f"data_check failed:\n{proc.stderr[-3000:]}")
    return json.loads(report.read_text())["loader"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tars", type=int, default=8)
    parser.add_argument("--per-tar", type=int, default=128)
    parser.add_argument("--mbs", type=int, default=32)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--side", type=int, default=256, help="JPEG side in the tars (NeMo resizes to 256)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        wdinfo, kib = build_set(root, args.tars, args.per_tar, args.side)
        config = write_config(root, wdinfo, args.mbs)
        batches = args.tars * args.per_tar // args.mbs
        print(
            f"demo set: {args.tars} tars x {args.per_tar} JPEGs {args.side}x{args.side} (mean {kib:.1f} KiB), "
            f"mbs {args.mbs}, {batches} batches, CPU cores: {os.cpu_count()}"
        )
        rates = {}
        for workers in args.workers:
            loader = measure(config, workers, batches, root / f"report-{workers}.json")
            rates[workers] = loader["images_per_s"] / max(workers, 1)
            print(
                f"workers={workers}: {loader['images_per_s']:.1f} images/s "
                f"({rates[workers]:.1f} per worker, first batch {loader['first_batch_s']:.2f} s, "
                f"{loader['batches_drawn']} batches)"
            )
    per_worker = rates[min(rates)]  # one worker's rate: no contention for this machine's cores
    for gpu, need in GPU_IMAGES_PER_S.items():
        print(
            f"{gpu} eats {need:.0f} images/s -> needs >= {math.ceil(need / per_worker)} loader workers "
            f"(one CPU core each) at {per_worker:.1f} images/s per worker"
        )


if __name__ == "__main__":
    main()
