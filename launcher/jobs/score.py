"""FID and CLIP score of each guidance scale's images: the evaluation's score job.

    <score python> -u -m launcher.jobs.score <run>/evaluation/evaluation.json    (in the checkout)

Libraries: torchmetrics' FrechetInceptionDistance and CLIPScore (Lightning AI; maintained, and already
in NeMo's container, which Lightning depends on). FID's network is torch-fidelity's port of the TF
Inception (2015-12-05) of the reference FID code, loaded from the file the assets job staged
(`feature_extractor_weights_path`: nothing is downloaded); tests/test_fid_reference.py checks the result
against torch-fidelity's own FID. CLIP score is torchmetrics' 100 x max(cosine, 0) with ViT-L/14 loaded
from the staged openai/clip-vit-large-patch14 folder. Real images: every val2014 image, centre-cropped to
a square and resized (bicubic) to the generated size, as NVIDIA's launcher prepares them.
Writes evaluation/results.csv and results.md (one row per guidance scale), then the plot.
"""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from data_prep.atomic import write_atomic
from data_prep.faults import step_main
from launcher.evaluation.settings import EvaluationSettings

COLUMNS = ("guidance_scale", "fid", "clip_score", "images")


def centre_square(path: Path, size: tuple[int, int]) -> Any:
    """The image's central square, resized to (height, width): uint8 tensor 3 x H x W."""
    import numpy as np
    import torch
    from PIL import Image

    with Image.open(path) as image:
        image = image.convert("RGB")
        side = min(image.size)
        left, top = (image.width - side) // 2, (image.height - side) // 2
        image = image.crop((left, top, left + side, top + side))
        if image.size != (size[1], size[0]):
            image = image.resize((size[1], size[0]), Image.BICUBIC)
        return torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1)


def image_size(path: Path) -> tuple[int, int]:
    """(height, width) of a generated image: the size the real images are brought to."""
    from PIL import Image

    with Image.open(path) as image:
        return image.height, image.width


def batches(paths: list[Path], size: tuple[int, int], batch: int) -> Iterator[Any]:
    import torch

    for start in range(0, len(paths), batch):
        yield torch.stack([centre_square(p, size) for p in paths[start : start + batch]])


def fid_per_scale(
    real: list[Path],
    generated: dict[float, list[Path]],
    size: tuple[int, int],
    weights: str,
    device: str,
    batch: int = 32,
    feature: int = 2048,
) -> dict[float, float]:
    """The real images' statistics once, then each scale's FID against them (`feature`: the Inception
    layer, evaluation.fid_features: 2048 for the standard FID)."""
    from torchmetrics.image.fid import FrechetInceptionDistance

    # antialias=False: the reference FID's TF-1.x-style bilinear resize to 299 px. torchmetrics 1.9's default
    # antialiases, which changes every score (tests/test_fid_reference.py saw 2.6% at 64 features).
    fid = FrechetInceptionDistance(
        feature=feature, reset_real_features=False, feature_extractor_weights_path=weights, antialias=False
    ).to(device)
    for images in batches(real, size, batch):
        fid.update(images.to(device), real=True)
    scores = {}
    for scale, paths in generated.items():
        fid.reset()  # the generated statistics only: reset_real_features=False keeps the real ones
        for images in batches(paths, size, batch):
            fid.update(images.to(device), real=False)
        scores[scale] = float(fid.compute())
    return scores


def clip_per_scale(
    generated: dict[float, list[Path]],
    captions: list[str],
    clip_dir: str,
    size: tuple[int, int],
    device: str,
    batch: int = 32,
) -> dict[float, float]:
    from torchmetrics.multimodal.clip_score import CLIPScore
    from transformers import CLIPModel, CLIPProcessor

    def local_clip() -> tuple[Any, Any]:
        return CLIPModel.from_pretrained(clip_dir), CLIPProcessor.from_pretrained(clip_dir)

    metric = CLIPScore(model_name_or_path=local_clip).to(device)
    scores = {}
    for scale, paths in generated.items():
        metric.reset()
        for start, images in zip(range(0, len(paths), batch), batches(paths, size, batch), strict=True):
            metric.update(list(images.to(device)), captions[start : start + len(images)])
        scores[scale] = float(metric.compute())
    return scores


def generated_images(s: EvaluationSettings) -> dict[float, list[Path]]:
    """Each scale's images in caption order; every caption must have its image."""
    out = {}
    for scale in s.guidance_scales:
        paths = [s.outputs.image(scale, n) for n in range(s.num_images)]
        missing = [p for p in paths if not p.is_file()]
        if missing:
            raise SystemExit(f"evaluation: {len(missing)} image(s) missing, e.g. {missing[0]}")
        out[float(scale)] = paths
    return out


def table(rows: list[dict[str, Any]]) -> tuple[str, str]:
    """results.csv and results.md."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    lines = ["| guidance scale | FID | CLIP score | images |", "| --- | --- | --- | --- |"]
    lines += [
        f"| {r['guidance_scale']} | {r['fid']:.2f} | {r['clip_score']:.2f} | {r['images']} |" for r in rows
    ]
    return buffer.getvalue(), "\n".join(lines) + "\n"


@step_main("evaluation")
def main(argv: list[str]) -> int:
    import json

    import torch

    s = EvaluationSettings.from_json(Path(argv[0]).read_text())
    device = "cuda" if torch.cuda.is_available() else "cpu"
    generated = generated_images(s)
    size = image_size(next(iter(generated.values()))[0])
    real = sorted((Path(s.coco_root) / "val2014").glob("*.jpg"))
    captions = [row["caption"] for row in json.loads(s.outputs.captions_json.read_text())]
    fids = fid_per_scale(real, generated, size, s.inception_weights, device, feature=s.fid_features)
    clips = clip_per_scale(generated, captions, s.clip_dir, size, device)
    rows = [
        {"guidance_scale": g, "fid": fids[g], "clip_score": clips[g], "images": len(generated[g])}
        for g in fids
    ]
    csv_text, md_text = table(rows)
    write_atomic(s.outputs.results_csv, csv_text)
    write_atomic(s.outputs.results_md, md_text)
    print(md_text, flush=True)
    env = {**os.environ, "PYTHONPATH": s.code_dir}
    plot = [s.plot_python, "-m", "launcher.jobs.evaluation_plot", str(s.run_dir)]
    return subprocess.run(plot, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
