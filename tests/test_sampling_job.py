"""The samples job's program (launcher/jobs/samples.py) run for real, with STAND-INs for NeMo's conversion
and sd_infer.py (tests/standin_sd_samples.py): which checkpoint it takes, when it converts again, what
it writes. NeMo's own conversion and inference run in tests/test_samples_nemo.py."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import SD_TEXT_ENCODER
from PIL import Image

from launcher.sampling.settings import SamplingSettings

REPO = Path(__file__).resolve().parent.parent
STANDIN = REPO / "tests" / "standin_sd_samples.py"
CKPT = "stable-diffusion--reduced_train_loss=0.5-step={step}-consumed_samples=4.0{tail}.ckpt"


def _run_folder(root: Path, crop: str = "128, 128") -> Path:
    checkpoints = root / "training" / "results" / "checkpoints"
    checkpoints.mkdir(parents=True)
    for step in (2, 4):
        for tail in ("", "-EMA"):
            (checkpoints / CKPT.format(step=step, tail=tail)).write_text("stand-in checkpoint")
    model = {
        "cond_stage_config": SD_TEXT_ENCODER,
        "data": {"train": {"augmentations": {"center_crop_h_w": crop}}},
    }
    (checkpoints.parent / "hparams.yaml").write_text(yaml.safe_dump({"cfg": model}))
    return root


def _settings(run: Path, **changes: object) -> SamplingSettings:
    base = SamplingSettings(
        run_dir=str(run),
        checkpoints_dir=str(run / "training/results/checkpoints"),
        checkpoint=None,
        ema=True,
        family="sd1",
        nemo_python=sys.executable,
        convert_script=str(STANDIN),
        infer_script=str(STANDIN),
        plot_python=sys.executable,
        code_dir=str(REPO),
        prompts=("a red bicycle", "a bowl of soup"),
        images_per_prompt=3,
        batch_size=4,
        seed=7,
        sampler="PLMS",
        steps=10,
        guidance_scale=7.5,
        resolution=None,
        precision="32-true",
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def _job(settings: SamplingSettings, folder: Path) -> subprocess.CompletedProcess[str]:
    path = folder / "samples.json"
    path.write_text(settings.to_json())
    argv = [sys.executable, "-m", "launcher.jobs.samples", str(path)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, cwd=REPO)


def test_newest_ema_checkpoint_at_the_trained_size_into_a_grid(tmp_path: Path) -> None:
    run = _run_folder(tmp_path / "run")
    done = _job(_settings(run), tmp_path)
    assert done.returncode == 0, done.stderr
    step_dir = run / "samples" / "step_4"
    assert (
        f"checkpoint {run}/training/results/checkpoints/{CKPT.format(step=4, tail='-EMA')} (step 4)"
        in done.stdout
    )
    config = yaml.safe_load((step_dir / "sd_infer.yaml").read_text())
    assert (config["infer"]["height"], config["infer"]["width"], config["infer"]["seed"]) == (128, 128, 7)
    assert config["model"]["restore_from_path"] == str(step_dir / "model.nemo")
    assert sorted(p.name for p in (step_dir / "images").iterdir()) == sorted(
        f"{prompt}_{i}.png" for prompt in ("a red bicycle", "a bowl of soup") for i in range(3)
    )
    with Image.open(step_dir / "grid.png") as grid:
        assert grid.size == (200 + 3 * 132 + 4, 30 + 2 * 132 + 4)
    # No training config here: the plot's error is reported, and the job still succeeds.
    assert "samples: training plot: error: " in done.stdout and "Traceback" not in done.stdout
    assert not list(step_dir.glob(".*"))  # no temporary leftovers


def test_a_converted_model_is_reused_only_for_its_own_checkpoint(tmp_path: Path) -> None:
    run, other = _run_folder(tmp_path / "run"), _run_folder(tmp_path / "other")
    assert _job(_settings(run), tmp_path).stdout.count("standin convert") == 1
    again = _job(_settings(run), tmp_path)
    assert again.returncode == 0 and "standin convert" not in again.stdout
    # Another run's step-4 checkpoint lands in the same step_4 folder: converted anew.
    given = other / "training/results/checkpoints" / CKPT.format(step=4, tail="")
    third = _job(_settings(run, checkpoint=str(given)), tmp_path)
    assert third.returncode == 0 and "standin convert " + CKPT.format(step=4, tail="-EMA") in third.stdout
    source = (run / "samples/step_4/model.nemo.source").read_text()
    assert source == str(given).removesuffix(".ckpt") + "-EMA.ckpt"


def test_no_finished_checkpoint_fails_the_job_clearly(tmp_path: Path) -> None:
    run = _run_folder(tmp_path / "run")
    for path in (run / "training/results/checkpoints").glob("*-EMA.ckpt"):
        path.unlink()
    done = _job(_settings(run), tmp_path)
    assert done.returncode == 1
    assert "samples: no finished EMA (-EMA.ckpt) checkpoint in" in done.stderr
