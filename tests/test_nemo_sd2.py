"""SD 2.0 (the 860m_res_256_v2_0_pretrain preset) with NeMo's own code on CPU, tiny sizes.

The text encoder is NeMo's FrozenOpenCLIPEmbedder built by open_clip from a file laid out where the assets
job stages OpenCLIP ViT-H-14 (`<assets.dir>/CLIP-ViT-H-14-laion2B-s32B-b79K/open_clip_pytorch_model.bin`),
a small built-in arch with random weights standing in for ViT-H-14 (tests/nemo_cpu/tiny.py); the UNet is
the preset's SD 2.0 one (num_head_channels 64, linear projections, context from the text width,
penultimate layer). The demo's data preparation runs with the latents switch on: the encode step
(data_prep.encode_latents) writes moments and OpenCLIP text embeddings with that same encoder; then
NeMo's sd_train trains 2 steps from the image tars and 2 steps from the latent tars.
"""

from __future__ import annotations

import pickle
import tarfile
from pathlib import Path

import pytest
from conftest import compose_config
from fixtures.export import checked_from_outside, exported, launch_export
from fixtures.nemo import FAST_LR
from nemo_cpu.harness import render_training, run_data_check, run_sd_train
from nemo_cpu.tiny import OPEN_CLIP_ARCH, OPEN_CLIP_FILE, OPEN_CLIP_WIDTH, SD2_OVERRIDES, TINY_OVERRIDES

from launcher.cli import launch

pytestmark = pytest.mark.slow

AUG = "training.model.data.train.augmentations"
SMALL = [
    f"{AUG}.resize_smallest_side=64",
    f"{AUG}.center_crop_h_w='64, 64'",
    "training.model.unet_config.image_size=8",
]
DATA = "data_sd2_256"  # the preset's own folder (training.data.folder)
CONFIG_NAME = "sd_860m_res_256_v2_0_pretrain.yaml"  # training.run.name


@pytest.fixture(scope="module")
def shared(new_shared, nemo_python: str) -> Path:
    shared_dir = new_shared("models")  # the tiny assets, OpenCLIP's included
    launch(
        compose_config(
            [
                f"cluster.shared_dir={shared_dir}",
                "data_preparation.demo.num_images=40",
                "data_preparation.precache.enable=true",
                f"data_preparation.precache.python={nemo_python}",
                "data_preparation.precache.batch_size=4",
                "assets.enable=false",  # the tiny assets stand where the assets job puts the real ones
                *TINY_OVERRIDES,
                *SD2_OVERRIDES,
                *SMALL,
            ]
        )
    )
    return shared_dir


def _trains_two_steps(shared: Path, nemo_python: str, run: str, *overrides: str) -> str:
    rendered = render_training(
        shared, run, *SD2_OVERRIDES, *SMALL, "training.trainer.max_steps=2", *overrides
    )
    config = rendered.parent / CONFIG_NAME
    text = config.read_text()
    assert f"version: {shared}/models/{OPEN_CLIP_FILE}" in text and "layer: penultimate" in text
    proc = run_sd_train(nemo_python, config, shared / f"{run}.log")
    assert proc.returncode == 0, proc.stderr[-4000:]
    log = (shared / f"{run}.log").read_text()
    # FrozenOpenCLIPEmbedder prints what open_clip builds from; it loads the file strictly.
    assert f"Downloading clip with {OPEN_CLIP_ARCH} {shared}/models/{OPEN_CLIP_FILE}" in log
    assert "`max_steps=2` reached" in log
    return text


def test_the_encode_step_stores_openclip_text_embeddings(shared: Path) -> None:
    latents = shared / DATA / "tarfiles_latents"
    info = pickle.loads((latents / "wdinfo.pkl").read_bytes())
    with tarfile.open(latents / info["tar_files"][0]) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(".pickle"))
        sample = pickle.loads(tar.extractfile(member).read())  # type: ignore[union-attr]
    # NeMo's precached loader reads the text under this hard-coded name, whatever the encoder.
    assert sample["clip-vit-large-patch14_text"].shape == (77, OPEN_CLIP_WIDTH)  # open_clip: 77, no padding
    assert sample["autoencoderkl_image"].shape == (8, 8, 8)


@pytest.fixture(scope="module")
def from_images(shared: Path, nemo_python: str) -> str:
    """The preset trained 2 steps from the image tars, at a learning rate that moves the weights (the export
    below compares what they answer)."""
    return _trains_two_steps(shared, nemo_python, "sd2_images", *FAST_LR)


def test_sd2_trains_from_images(shared: Path, from_images: str) -> None:
    assert f"{shared}/{DATA}/tarfiles_reorganized" in from_images and "first_stage_key: images" in from_images


def test_the_sd2_run_exports_to_diffusers_in_fp16(shared: Path, nemo_python: str, from_images: str) -> None:
    """OpenCLIP's penultimate layer then its final norm (NeMo's FrozenOpenCLIPEmbedder) is the last hidden
    state of a transformers CLIPTextModel one layer short; the single file keeps every layer."""
    run = launch_export(shared, "sd2_images", nemo_python, "export.ema=false", "export.dtype=fp16")
    record = exported(run, 2)
    print(record["checks"])  # shown with -s: the numbers docs/export.md quotes
    assert (record["family"], record["dtype"], record["ema"]) == ("sd2", "fp16", False)
    assert record["checks"]["unet"]["max_abs"] > 0.5
    outside = checked_from_outside(nemo_python, run, 2)
    print(outside)
    assert outside["pipeline"] == "StableDiffusionPipeline" and outside["single_file_differing"] == []
    assert outside["unet_max_abs_diff"] <= 1e-4 and outside["context_max_abs_diff"] <= 1e-4
    assert outside["image"][:2] == [64, 64] and outside["image"][2] > 1000


def test_sd2_trains_from_latents(shared: Path, nemo_python: str) -> None:
    text = _trains_two_steps(shared, nemo_python, "sd2_latents", "data_preparation.precache.enable=true")
    assert f"{shared}/{DATA}/tarfiles_latents" in text and "first_stage_key: image_encoded" in text


def test_model_check_builds_openclip_from_the_staged_file(shared: Path, nemo_python: str) -> None:
    """data_check's model check (before any GPU time) on the SD 2.0 config: a file, not a folder."""
    config = render_training(shared, "sd2_check", *SD2_OVERRIDES, *SMALL).parent / CONFIG_NAME
    code, report = run_data_check(
        nemo_python, config, config.parent / "report.json", "--model-check", "--batches", "1"
    )
    assert code == 0, report["errors"]
    assert report["models"]["text_encoder"]["embedding_shape"] == [1, 77, OPEN_CLIP_WIDTH]
