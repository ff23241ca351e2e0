"""ControlNet with NeMo's own code on CPU (issue 47.2): the preset training=controlnet/sd15_512 rendered at
tiny sizes on the demo's data; its hints step writes a Canny hint beside every sample; data_check draws NeMo's
own ControlNet batches with the hint; NeMo's own controlnet_train.py (tests/nemo_cpu/controlnet_train_cpu.py)
trains two steps on them, both UNets from a tiny stand-in of SD 1.5's single-file checkpoint.

Parts that are STAND-INS: the tiny CLIP, VAE and checkpoint (random weights at CPU sizes)."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from fixtures.nemo import REPO
from nemo_cpu.harness import (
    render_training,
    run_data_check,
    run_sd_train,
    samples_on_cpu,
    unet_load_report,
)
from nemo_cpu.tiny import TINY_OVERRIDES, WIDTH
from PIL import Image

from launcher.cli import compose_config, launch
from launcher.plugins.controlnet.family import CKPT_FILE

pytestmark = pytest.mark.slow

CONTROLNET_TRAIN_CPU = REPO / "tests" / "nemo_cpu" / "controlnet_train_cpu.py"
CONTROLNET_INFER_CPU = REPO / "tests" / "nemo_cpu" / "controlnet_infer_cpu.py"
PROMPTS = ("a house by a lake", "a boat at sea")
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
RUN = "controlnet"
OVERRIDES = (
    "training=controlnet/sd15_512",
    "training.trainer.max_steps=2",
    "training.exp_manager.checkpoint_callback_params.every_n_train_steps=2",
    f"{CROP}.resize_smallest_side=64",  # the demo's 256 px images at 64 px crops: 8x8 latents
    f"{CROP}.center_crop_h_w='64, 64'",
    # The hint reaches the UNet through two zero-initialised convolutions in series (ControlNet's input hint
    # block and its output convs): after two Adam steps its effect is about lr^2, so a large rate makes the
    # tiny model's samples depend on the hint visibly (the samples test).
    "training.model.optim.lr=0.2",
)


_ZERO_CONVS_MOVED = """
import sys, torch
state = torch.load(sys.argv[1], map_location="cpu", weights_only=False)["state_dict"]
convs = [v for k, v in state.items() if ".control_model.zero_convs." in k and k.endswith("weight")]
print(bool(convs) and all(bool(v.any()) for v in convs))
"""


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


@dataclass(frozen=True)
class TrainedControlNet:
    """The module's one tiny ControlNet run: its shared folder, training config, and what each step said."""

    shared: Path
    config: Path
    tar_dir: Path
    before: tuple[int, dict]  # data_check before the hints: (exit status, report)
    hints: subprocess.CompletedProcess[str]
    after: tuple[int, dict]
    written: subprocess.CompletedProcess[str]
    trained: subprocess.CompletedProcess[str]
    python: str  # NeMo's interpreter


@pytest.fixture(scope="module")
def controlnet_run(
    new_shared, nemo_python: str, tmp_path_factory: pytest.TempPathFactory
) -> TrainedControlNet:
    """The preset rendered tiny, the hints step, data_check before and after it, the stand-in checkpoint and
    two steps of NeMo's controlnet_train.py: once, for the training test and the samples test."""
    shared, logs = new_shared(), tmp_path_factory.mktemp("controlnet_logs")
    (shared / "data_512").symlink_to("data")  # the preset's data folder: the demo's tars
    render_training(shared, RUN, *OVERRIDES, tiny=(*TINY_OVERRIDES, *TINY_CONTROL))
    config = next((shared / "results" / RUN / "training").glob("*.yaml"))
    tar_dir = shared / "data_512" / "tarfiles_reorganized"
    before = run_data_check(nemo_python, config, logs / "before.json", "--precheck-only")
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
    after = run_data_check(nemo_python, config, logs / "after.json", "--batches", "2")
    ckpt = shared / "models" / "sd15-ckpt" / CKPT_FILE  # where the assets job stages SD 1.5's checkpoint
    ckpt.parent.mkdir(parents=True)
    written = subprocess.run(
        [nemo_python, str(CONTROLNET_TRAIN_CPU), "--write-checkpoint", str(config), str(ckpt)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    trained = run_sd_train(nemo_python, config, logs / "train.log", runner=CONTROLNET_TRAIN_CPU)
    return TrainedControlNet(shared, config, tar_dir, before, hints, after, written, trained, nemo_python)


def test_nemo_trains_controlnet_on_the_hints_step_output(controlnet_run: TrainedControlNet) -> None:
    run = controlnet_run
    # data_check before the hints: every tar refused naming the member NeMo's controlnet dataset reads.
    code, report = run.before
    assert code == 1 and report["errors"] and all("no .png members" in e for e in report["errors"]), report

    assert run.hints.returncode == 0, run.hints.stderr
    samples, hinted = _hint_members(run.tar_dir)
    assert samples == hinted == 220 and "220 Canny hints written" in run.hints.stdout, run.hints.stdout

    code, report = run.after
    assert code == 0, report["errors"]
    loader = report["loader"]
    assert loader["batches_drawn"] == 2 and loader["hint"] == loader["images"] == [2, 64, 64, 3], loader

    assert run.written.returncode == 0, (run.written.stdout + run.written.stderr)[-3000:]
    log = run.trained.stdout + run.trained.stderr
    assert run.trained.returncode == 0, log[-4000:]
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
    last = sorted((run.config.parent / "results" / "checkpoints").glob("*step=2*-last.ckpt"))
    assert last
    # Training moved the control stage's zero-initialised convolutions (what feeds the hint to the UNet).
    moved = subprocess.run(
        [run.python, "-c", _ZERO_CONVS_MOVED, str(last[0])], capture_output=True, text=True
    )
    assert moved.returncode == 0 and moved.stdout.split() == ["True"], moved.stdout + moved.stderr[-2000:]


def _hint(path: Path, seed: int) -> Path:
    """A hint image: white strokes on black, as Canny edges are, at another size than the trained 64 px."""
    image = np.zeros((48, 80, 3), np.uint8)
    for row in np.random.default_rng(seed).integers(0, 48, 6):
        image[row, :] = 255
    Image.fromarray(image).save(path)
    return path


def _sample(run: TrainedControlNet, nemo_python: str, hints: tuple[Path, Path]) -> dict[str, bytes]:
    """stages=[samples] on the local backend (the .nemo training saved at its end, NeMo's controlnet_infer.py
    on CPU), each prompt drawn from its hint; returns the images it wrote, by name."""
    out = launch(
        compose_config(
            [
                f"cluster.shared_dir={run.shared}",
                f"run_name={RUN}",
                "stages=[samples]",
                "assets.enable=false",
                "data_preparation.precache.enable=false",
                *OVERRIDES,
                *samples_on_cpu(nemo_python, CONTROLNET_INFER_CPU),
                "samples.steps=5",
                "samples.images_per_prompt=1",
                "samples.precision=32-true",  # the CPU runner's (its docstring)
                f"samples.prompts=[{','.join(PROMPTS)}]",
                f"controlnet_hints.hint_images=[{hints[0]},{hints[1]}]",
            ]
        )
    )
    log = next((out / "samples" / "logs").glob("samples_*.out")).read_text()
    assert "controlnet_infer_cpu: running NeMo's own" in log, log[-3000:]
    images = out / "samples" / "step_2" / "images"
    assert (out / "samples" / "step_2" / "grid.png").is_file(), log[-3000:]
    return {path.name: path.read_bytes() for path in images.glob("*_0.png")}


def test_the_samples_job_draws_from_the_hint_images(
    controlnet_run: TrainedControlNet, nemo_python: str, tmp_path: Path
) -> None:
    """The same prompts and seed twice: the first prompt from the same hint (the same image: sampling is
    deterministic), the second from another hint (another image: the hint is read)."""
    assert controlnet_run.trained.returncode == 0, controlnet_run.trained.stderr[-3000:]
    edges, other = _hint(tmp_path / "edges.png", 0), _hint(tmp_path / "other.png", 1)
    first = _sample(controlnet_run, nemo_python, (edges, edges))
    second = _sample(controlnet_run, nemo_python, (edges, other))
    names = [f"{prompt}_0.png" for prompt in PROMPTS]
    assert sorted(first) == sorted(second) == sorted(names), sorted(first)
    for name in names:
        with Image.open(io.BytesIO(first[name])) as image:
            assert image.size == (64, 64) and np.asarray(image).std() > 0  # the trained size, a picture
    assert first[names[0]] == second[names[0]]
    changed = np.abs(
        np.asarray(Image.open(io.BytesIO(first[names[1]]))).astype(int)
        - np.asarray(Image.open(io.BytesIO(second[names[1]]))).astype(int)
    )
    print(f"pixels changed by the other hint: {(changed > 0).mean():.2%}, by up to {changed.max()}")
    assert changed.max() > 0
