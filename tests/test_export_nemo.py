"""The export stage end to end on the session's tiny SD 1.x run (NeMo 2.4.1 trained it 2 steps, then 4; EMA
on), with NeMo's and diffusers' own code on CPU, on the local backend.

The job's own checks (its export.json) are read, and the output is checked again from outside
(tests/nemo_cpu/export_cpu.py): diffusers' own DiffusionPipeline loads the folder offline, caption -> NeMo's
text encoder -> NeMo's UNet against caption -> the pipeline's encode_prompt -> its UNet, an image drawn, the
single file read back by from_single_file. The EMA weights of a 4-step run are its first weights less 1e-4 of
each step (decay 0.9999): NeMo's zero-initialised output layers keep the UNet's answer near 4e-4, where no
mapping fault would show; the trained weights (learning rate 0.01) answer near 2, and a swapped tensor
fails the job's UNet check.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures.export import checked_from_outside, exported, launch_export
from fixtures.nemo import TINY_RUN, TinyTraining

from launcher.stages.export import status_lines

pytestmark = pytest.mark.slow


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
    assert outside["unet_max_abs"] > 0.5 and outside["unet_max_abs_diff"] <= 1e-4
    assert (
        outside["tampered"] is not None
        and "the UNet's output differs: max |diffusers - NeMo|" in outside["tampered"]
    )
