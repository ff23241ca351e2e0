"""The export stage end to end on the session's tiny SD 1.x run (NeMo 2.4.1 trained it 2 steps, then 4; EMA
on), with NeMo's and diffusers' own code on CPU, on the local backend.

The job's own checks (its export.json) are read, and the output is checked again from outside
(tests/nemo_cpu/export_cpu.py): diffusers' own DiffusionPipeline loads the folder offline, caption -> NeMo's
text encoder -> NeMo's UNet against caption -> the pipeline's encode_prompt -> its UNet, an image drawn, the
single file read back by from_single_file. EMA at decay 0.9999 moves a weight 1e-4 of the way a step: after
4 steps the EMA weights are nearly the first ones, whose zero-initialised output layers (NeMo's) keep the UNet's
answer near 4e-4, where a mapping fault would hardly show; the trained weights (learning rate 0.01) answer near
2, and a swapped tensor fails the job's UNet check. The released sizes are checked on the meta device.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, compose_config
from fixtures.export import checked_from_outside, exported, launch_export
from fixtures.nemo import TINY_RUN, TinyTraining
from omegaconf import OmegaConf

from launcher.errors import LauncherError
from launcher.stages.export import status_lines

pytestmark = pytest.mark.slow
NAMES_CPU = REPO / "tests" / "nemo_cpu" / "export_names_cpu.py"


def test_the_newest_ema_checkpoint_becomes_a_diffusers_pipeline_and_a_single_file(
    tiny_training: TinyTraining, tmp_path: Path, nemo_python: str
) -> None:
    run = launch_export(tiny_training.copy_to(tmp_path), TINY_RUN, nemo_python)
    log = next((run / "export" / "logs").glob("export_*.out")).read_text()
    record = exported(run, 4)
    assert record["checkpoint"].endswith("-step=4-consumed_samples=8.0-last-EMA.ckpt") and record["ema"]
    assert (record["family"], record["dtype"]) == ("sd1", "fp32")
    checks = record["checks"]
    print(checks)  # shown with -s: the numbers docs/export.md quotes
    assert checks["unet"]["max_abs_diff"] <= 1e-4 and checks["text"]["tokens"]["max_abs_diff"] <= 1e-4
    assert checks["single_file_tensors"] > 500 and "export: checked against NeMo" in log
    assert not list((run / "export").glob(".step_*"))  # the partial folder was renamed into place
    outside = checked_from_outside(nemo_python, run, 4)
    print(outside)
    assert outside["pipeline"] == "StableDiffusionPipeline" and outside["prediction_type"] == "epsilon"
    assert outside["unet_max_abs_diff"] <= 1e-4 and outside["context_max_abs_diff"] <= 1e-4
    assert outside["image"][:2] == [64, 64] and outside["image"][2] > 1000  # a picture, not a flat fill
    assert outside["single_file_differing"] == []
    assert status_lines(run) == [
        f"export: newest export/step_4/diffusers and {TINY_RUN}-step_4.safetensors (EMA, fp32; 1 checkpoint(s) "
        "exported)"
    ]


def test_trained_weights_match_nemo_and_a_swapped_tensor_fails_the_check(
    tiny_training: TinyTraining, tmp_path: Path, nemo_python: str
) -> None:
    shared = tiny_training.copy_to(tmp_path)
    given = next(
        p
        for p in (shared / "results" / TINY_RUN).glob("training/results/checkpoints/*-step=4-*.ckpt")
        if not p.name.endswith("-EMA.ckpt")
    )
    run = launch_export(shared, TINY_RUN, nemo_python, f"export.checkpoint='{given}'", "export.ema=false")
    record = exported(run, 4)
    assert (record["checkpoint"], record["ema"]) == (str(given), False)
    unet = record["checks"]["unet"]
    print(record["checks"])
    assert unet["max_abs"] > 0.5 and unet["max_abs_diff"] <= 1e-5  # an answer any fault would move
    outside = checked_from_outside(nemo_python, run, 4, tampered=True)
    print(outside)
    assert outside["unet_max_abs"] > 0.5 and outside["unet_max_abs_diff"] <= 1e-4
    assert (
        outside["tampered"] is not None
        and "the UNet's output differs: max |diffusers - NeMo|" in outside["tampered"]
    )


# The presets of the released models' sizes: SD 1.5, SD 2.1-base, SDXL base 1.0.
RELEASED_SIZES = (
    "stable_diffusion/860m_res_512_v1_5",
    "stable_diffusion/860m_res_512_v2_0_base",
    "sdxl/sdxl_base_train_res_1024_stage_3",
)


def test_at_the_released_sizes_every_diffusers_tensor_is_filled(nemo_python: str, tmp_path: Path) -> None:
    """NeMo's UNet and VAE of each preset on the meta device, as the export writes and diffusers converts them,
    against diffusers' models of the configs the export writes (tests/nemo_cpu/export_names_cpu.py): no tensor
    left unset, none unplaced, every shape the same; the UNet config the released model's."""
    models = {
        preset: OmegaConf.to_container(compose_config([f"training={preset}"]).training.model, resolve=True)
        for preset in RELEASED_SIZES
    }
    (tmp_path / "presets.json").write_text(json.dumps(models))
    done = subprocess.run(
        [nemo_python, str(NAMES_CPU), str(tmp_path / "presets.json")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    counts = {
        preset: (found[preset]["unet"]["tensors"], found[preset]["vae"]["tensors"])
        for preset in RELEASED_SIZES
    }
    assert counts == dict(zip(RELEASED_SIZES, [(686, 248), (686, 248), (1680, 248)], strict=True))
    for preset in RELEASED_SIZES:
        for part in ("unet", "vae"):
            assert found[preset][part] | {"tensors": 0} == {
                "missing": [],
                "unexpected": [],
                "shapes": [],
                "tensors": 0,
            }
        assert found[preset]["unet_config_differs"] == [], preset


_NOT_SD = """
import sys, torch
torch.save({"state_dict": {"model.linear.weight": torch.ones(2, 2)}}, sys.argv[1])
"""


def test_a_failed_export_ends_in_one_line_and_leaves_no_step_folder(
    tiny_training: TinyTraining, tmp_path: Path, nemo_python: str
) -> None:
    """A checkpoint with the run's hparams.yaml but no UNet (not a NeMo SD checkpoint): the job's line names
    it, and no step folder (finished or partial) is left."""
    shared = tiny_training.copy_to(tmp_path)
    folder = shared / "results" / TINY_RUN / "training" / "results" / "checkpoints"
    fake = folder / "other--step=9.ckpt"
    subprocess.run([nemo_python, "-c", _NOT_SD, str(fake)], check=True, timeout=120)
    line = "the checkpoint holds no model.model.diffusion_model.* tensors: not a NeMo Stable Diffusion checkpoint"
    with pytest.raises(LauncherError, match=re.escape(f"export: error: {line}")):
        launch_export(shared, TINY_RUN, nemo_python, f"export.checkpoint='{fake}'", "export.ema=false")
    run = shared / "results" / TINY_RUN
    log = next((run / "export" / "logs").glob("export_*.out")).read_text()
    errors = [line for line in log.splitlines() if line.startswith("export: error:")]
    assert errors == [f"export: error: {line}"]
    assert "Traceback" not in log
    assert not [p.name for p in (run / "export").iterdir() if p.name.startswith((".step_", "step_"))]
