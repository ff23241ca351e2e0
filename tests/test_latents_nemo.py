"""Cached latents on CPU with NeMo's own code and tiny modules (tests/nemo_cpu/tiny.py).

The demo's data preparation runs on the local backend with `data_preparation.precache.enable=true`: the
encode step builds NeMo's VAE and CLIP text encoder from the training config and writes the latent tars,
then their wdinfo. Then: the stored moments equal what NeMo's VAE gives for the same image; NeMo's own
sd_train trains 2 steps from them; data_check reads them with NeMo's precached loader; and a kill -9
mid-tar followed by a rerun gives the same bytes as the uninterrupted run.

Sizes: 64 px crops (8x8 latents) instead of 256 so that encoding takes seconds on 2 cores; the shapes
follow from the config exactly as at 256 (the switch's checks demand unet_config.image_size = crop / 8).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
from conftest import compose_config
from fixtures.disk import fill, small_tmpfs
from fixtures.nemo import nemo_python_path
from nemo_cpu.harness import REPO, render_training, run_data_check, run_sd_train
from nemo_cpu.tiny import TINY_OVERRIDES

from data_prep.family_settings import settings_path
from launcher.cli import launch

pytestmark = pytest.mark.slow

AUG = "training.model.data.train.augmentations"
LATENTS = "data_preparation.precache.enable=true"
SMALL = [
    f"{AUG}.resize_smallest_side=64",
    f"{AUG}.center_crop_h_w='64, 64'",
    "training.model.unet_config.image_size=8",
]
BATCH = 4
# One float16 step: the stored value is NeMo's float32 output rounded to float16 (11 bits, 2^-11
# relative), and a batch of 4 may differ from a batch of 1 in float32's last bits.
RTOL, ATOL = 2**-10, 1e-5

REFERENCE = r"""
import io, json, pickle, sys, tarfile
import numpy as np, torch
from omegaconf import OmegaConf
from hydra.utils import instantiate
import data_prep.nemo_compat
from nemo.collections.multimodal.data.common.webdataset import pil_loader
from nemo.collections.multimodal.data.stable_diffusion.augmentation.augmentations import construct_image_augmentations

model = OmegaConf.load(sys.argv[1]).model
image_tar, latent_tar = sys.argv[2], sys.argv[3]
with tarfile.open(image_tar) as tar:
    key = tar.getnames()[0].split(".")[0]
    jpg = tar.extractfile(key + ".jpg").read()
    caption = tar.extractfile(key + ".txt").read().decode()
with tarfile.open(latent_tar) as tar:
    names = tar.getnames()
    stored = pickle.loads(tar.extractfile(key + ".pickle").read())
vae = instantiate(model.first_stage_config).eval()
clip = instantiate(model.cond_stage_config, device="cpu").eval()
x = construct_image_augmentations(model.data.train.augmentations)(pil_loader("a.jpg", jpg))
with torch.no_grad():
    moments = vae.encode(x[None]).parameters[0].numpy()
    text = clip.encode([caption])[0].numpy()
out = {"key": key, "members": len(names)}
for name, ref in (("autoencoderkl_image", moments), ("clip-vit-large-patch14_text", text)):
    got = stored[name].astype(np.float32)
    close = np.allclose(got, ref, rtol=float(sys.argv[4]), atol=float(sys.argv[5]))
    out[name] = {"dtype": str(stored[name].dtype), "shape": list(got.shape), "ref_shape": list(ref.shape),
                "close": bool(close), "max_abs_diff": float(np.abs(got - ref).max()),
                "ref_abs_max": float(np.abs(ref).max())}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def shared(new_shared, nemo_python: str) -> Path:
    """The demo through data preparation with the switch on (local backend, real jobs), tiny assets."""
    shared_dir = new_shared("models")
    launch(
        compose_config(
            [
                f"cluster.shared_dir={shared_dir}",
                "data_preparation.demo.num_images=80",
                "data_preparation.precache.enable=true",
                f"data_preparation.precache.python={nemo_python}",
                f"data_preparation.precache.batch_size={BATCH}",
                "assets.enable=false",  # the tiny assets stand where the assets job puts the real ones
                *TINY_OVERRIDES,
                *SMALL,
            ]
        )
    )
    return shared_dir


def _tars(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.tar"))}


def test_the_encode_step_writes_latent_tars_and_an_exact_wdinfo(shared: Path) -> None:
    latents, images = shared / "data/tarfiles_latents", shared / "data/tarfiles_reorganized"
    image_info = pickle.loads((images / "wdinfo.pkl").read_bytes())
    info = pickle.loads((latents / "wdinfo.pkl").read_bytes())
    assert info["tar_files"] == image_info["tar_files"] and info["chunk_size"] == image_info["chunk_size"]
    counted = 0
    for name in info["tar_files"]:
        with tarfile.open(latents / name) as tar:
            members = tar.getnames()
        assert all(m.endswith(".pickle") for m in members)
        with tarfile.open(images / name) as tar:
            assert [m.removesuffix(".pickle") for m in members] == sorted(
                {n.split(".")[0] for n in tar.getnames()}
            )
        counted += len(members)
    assert info["total_key_count"] == counted == image_info["total_key_count"]
    assert not list(latents.glob(".*.tmp"))


def test_stored_moments_equal_nemos_vae_output_for_the_same_image(shared: Path, nemo_python: str) -> None:
    config = shared / "results/sd_860m_res_256/training/sd_860m_res_256.yaml"
    args = [
        config,
        shared / "data/tarfiles_reorganized/000000.tar",
        shared / "data/tarfiles_latents/000000.tar",
    ]
    proc = subprocess.run(
        [nemo_python, "-c", REFERENCE, *map(str, args), str(RTOL), str(ATOL)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    moments, text = found["autoencoderkl_image"], found["clip-vit-large-patch14_text"]
    assert (moments["dtype"], moments["shape"], moments["ref_shape"]) == ("float16", [8, 8, 8], [8, 8, 8])
    assert (text["dtype"], text["shape"], text["ref_shape"]) == ("float16", [80, 32], [80, 32])
    assert moments["ref_abs_max"] > 0.01 and text["ref_abs_max"] > 0.01  # not a trivially-zero comparison
    assert moments["close"] and text["close"], found


def test_nemo_sd_train_trains_two_steps_from_the_latents(shared: Path, nemo_python: str) -> None:
    config = render_training(shared, "from_latents", LATENTS, "training.trainer.max_steps=2", *SMALL)
    rendered = config.read_text()
    assert "first_stage_key: image_encoded" in rendered and "cond_stage_key: captions_encoded" in rendered
    assert f"local_root_path: {shared}/data/tarfiles_latents" in rendered
    proc = run_sd_train(nemo_python, config, shared / "from_latents.log")
    assert proc.returncode == 0, proc.stderr[-4000:]
    log = (shared / "from_latents.log").read_text()
    assert "`max_steps=2` reached" in log and "consumed_samples=4.0" in log


def _data_check(nemo_python: str, config: Path, report: Path) -> dict:
    args = (
        "--world-size",
        "1",
        "--num-workers",
        "1",
        "--micro-batch-size",
        "4",
        "--batches",
        "2",
        "--scan-tars",
        "0",
    )
    return run_data_check(nemo_python, config, report, *args)[1]


def test_data_check_reads_the_latents_with_nemos_precached_loader(shared: Path, nemo_python: str) -> None:
    config = render_training(shared, "check", LATENTS, *SMALL)
    report = _data_check(nemo_python, config, shared / "check.json")
    assert report["ok"], report["errors"]
    loader = report["loader"]
    assert (loader["images"], loader["images_dtype"]) == ([4, 8, 8, 8], "torch.float16")
    assert (loader["captions"], loader["captions_dtype"]) == ([4, 80, 32], "torch.float16")
    assert report["wdinfo"]["total_key_count"] == sum(s["pickle_samples"] for s in report["scans"])
    # The latent config pointed at the image tars is named, not trained on.
    wrong = shared / "wrong.yaml"
    wrong.write_text(config.read_text().replace("tarfiles_latents", "tarfiles_reorganized"))
    shutil.copyfile(settings_path(config), settings_path(wrong))  # the same model keys: the same answers
    report = _data_check(nemo_python, wrong, shared / "wrong.json")
    assert not report["ok"] and "no .pickle members" in report["errors"][0]


def _encode(nemo_python: str, shared: Path, output: Path) -> subprocess.Popen:
    config = shared / "results/sd_860m_res_256/training/sd_860m_res_256.yaml"
    images = shared / "data/tarfiles_reorganized"
    return subprocess.Popen(
        [
            nemo_python,
            "-m",
            "data_prep.encode_latents",
            "encode",
            "--training-config",
            str(config),
            "--input-dir",
            str(images),
            "--input-wdinfo",
            str(images / "wdinfo.pkl"),
            "--output-dir",
            str(output),
            "--batch-size",
            str(BATCH),
            "--device",
            "cpu",
            "--worker-index",
            "0",
            "--num-workers",
            "1",
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_kill_9_mid_tar_then_rerun_gives_the_bytes_of_an_uninterrupted_run(
    shared: Path, nemo_python: str
) -> None:
    output = shared / "killed"
    # NeMo's real interpreter, not the session's fork server: the process killed is the encoder itself.
    proc = _encode(nemo_python_path(), shared, output)
    deadline = time.monotonic() + 300
    # Mid-tar: the first tar committed, the second being written under its temporary name.
    while not (list(output.glob("_counts/*.json")) and list(output.glob(".000001.tar.*.tmp"))):
        assert proc.poll() is None and time.monotonic() < deadline, "encode ended before it could be killed"
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert [p.name for p in output.glob("*.tar")] == ["000000.tar"] and list(output.glob(".000001.tar.*.tmp"))
    kept = (output / "_counts/000000.json").stat().st_mtime_ns
    rerun = _encode(nemo_python, shared, output)
    out, _ = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, out[-3000:]
    assert "1 already encoded" in out and (output / "_counts/000000.json").stat().st_mtime_ns == kept
    assert not list(output.glob(".*.tmp"))
    assert _tars(output) == _tars(shared / "data/tarfiles_latents")  # the launcher's uninterrupted run


def test_encode_latents_on_a_full_disk_ends_in_one_line(shared: Path, nemo_python: str) -> None:
    """The latent tars' folder on a full tmpfs: one line naming it, no traceback (tests/test_full_disk.py
    does the same for the other data steps)."""
    with small_tmpfs() as disk:
        fill(disk, 0)
        encode = _encode(nemo_python, shared, disk / "latents")
        out, _ = encode.communicate(timeout=600)
    assert encode.returncode == 1 and "Traceback" not in out, out[-2000:]
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"encode_latents: error: {disk}/latents") and last.endswith("(ENOSPC)"), out[
        -2000:
    ]
