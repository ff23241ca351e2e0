"""ControlNet with NeMo's own code on CPU (issue 47.2): the preset training=controlnet/sd15_512 rendered at
tiny sizes on the demo's data; its hints step writes a Canny hint beside every sample; data_check draws NeMo's
own ControlNet batches with the hint; NeMo's own controlnet_train.py (tests/nemo_cpu/controlnet_train_cpu.py)
trains two steps on them, both UNets from a tiny stand-in of SD 1.5's single-file checkpoint.

Parts that are STAND-INS: the tiny CLIP, VAE and checkpoint (random weights at CPU sizes)."""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from fixtures.nemo import REPO
from nemo_cpu.harness import render_training, run_data_check, run_sd_train, unet_load_report
from nemo_cpu.tiny import TINY_OVERRIDES, WIDTH

from launcher.plugins.controlnet.family import CKPT_FILE

pytestmark = pytest.mark.slow

CONTROLNET_TRAIN_CPU = REPO / "tests" / "nemo_cpu" / "controlnet_train_cpu.py"
PARAMS = "training.model.control_stage_config.params"
CROP = "training.model.data.train.augmentations"
# The control stage at the UNet's tiny sizes (it copies the UNet's encoder: the same widths and levels).
TINY_CONTROL = (
    f"{PARAMS}.model_channels={WIDTH}",
    f"{PARAMS}.channel_mult=[1,2]",
    f"{PARAMS}.attention_resolutions=[2]",
    f"{PARAMS}.num_res_blocks=1",
    f"{PARAMS}.num_heads=2",
    f"{PARAMS}.context_dim={WIDTH}",
)
OVERRIDES = (
    "training=controlnet/sd15_512",
    "training.trainer.max_steps=2",
    "training.exp_manager.checkpoint_callback_params.every_n_train_steps=2",
    f"{CROP}.resize_smallest_side=64",  # the demo's 256 px images at 64 px crops: 8x8 latents
    f"{CROP}.center_crop_h_w='64, 64'",
)


def _hint_members(tar_dir: Path) -> tuple[int, int]:
    """(samples, samples with a .png) over the tars."""
    keys, hinted = set(), set()
    for path in tar_dir.glob("*.tar"):
        with tarfile.open(path) as tar:
            for name in tar.getnames():
                key, _, ext = name.partition(".")
                keys.add((path.name, key))
                if ext == "png":
                    hinted.add((path.name, key))
    return len(keys), len(hinted)


def test_nemo_trains_controlnet_on_the_hints_step_output(
    new_shared, nemo_python: str, tmp_path: Path
) -> None:
    shared = new_shared()
    (shared / "data_512").symlink_to("data")  # the preset's data folder: the demo's tars
    render_training(shared, "controlnet", *OVERRIDES, tiny=(*TINY_OVERRIDES, *TINY_CONTROL))
    config = next((shared / "results" / "controlnet" / "training").glob("*.yaml"))
    tar_dir = shared / "data_512" / "tarfiles_reorganized"

    # data_check before the hints: every tar refused naming the member NeMo's controlnet dataset reads.
    code, report = run_data_check(nemo_python, config, tmp_path / "before.json", "--precheck-only")
    assert code == 1 and report["errors"] and all("no .png members" in e for e in report["errors"]), report

    hints = subprocess.run(
        [
            sys.executable,
            "-m",
            "launcher.plugins.controlnet.hints",
            str(tar_dir),
            "--low",
            "100",
            "--high",
            "200",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert hints.returncode == 0, hints.stderr
    samples, hinted = _hint_members(tar_dir)
    assert samples == hinted == 220 and "220 Canny hints written" in hints.stdout, hints.stdout

    code, report = run_data_check(nemo_python, config, tmp_path / "after.json", "--batches", "2")
    assert code == 0, report["errors"]
    loader = report["loader"]
    assert loader["batches_drawn"] == 2 and loader["hint"] == loader["images"] == [2, 64, 64, 3], loader

    ckpt = shared / "models" / "sd15-ckpt" / CKPT_FILE  # where the assets job stages SD 1.5's checkpoint
    ckpt.parent.mkdir(parents=True)
    written = subprocess.run(
        [nemo_python, str(CONTROLNET_TRAIN_CPU), "--write-checkpoint", str(config), str(ckpt)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert written.returncode == 0, (written.stdout + written.stderr)[-3000:]

    done = run_sd_train(nemo_python, config, tmp_path / "train.log", runner=CONTROLNET_TRAIN_CPU)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    batches = re.findall(r"controlnet_train_cpu: batch hint=\[2, 64, 64, 3\]", log)
    assert len(batches) >= 2, log[-4000:]  # a batch read for each step (none: NeMo dropped every sample)
    line, counts = unet_load_report(log)
    assert counts["missing"] == 0 and counts["equal"] == counts["total"], line
    equal, total = map(int, re.search(r"control from_pretrained_unet: equal=(\d+) of (\d+)", log).groups())
    # Every control tensor but the hint encoder and the zero convolutions (ControlNet's own) is the UNet's.
    assert total > equal > total // 2, (equal, total)
    losses = [float(v) for v in re.findall(r"reduced_train_loss=([0-9.]+)", log)]
    assert losses and all(0 < loss < 10 for loss in losses), losses
    print(
        f"batches {len(batches)}, control tensors {equal}/{total}, losses {sorted(set(losses), reverse=True)}"
    )
    assert sorted((config.parent / "results" / "checkpoints").glob("*step=2*.ckpt"))
