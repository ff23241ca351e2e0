"""`python -m launcher plot RUN` on TensorBoard events NeMo's own SD training wrote (on CPU).

tests/data/nemo_cpu_train_events/ holds the event file of a 4-step CPU run and, in printed.json, the
values the same run printed in its progress bar: the plot's curves must be those values.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from PIL import Image

from launcher.outputs import TrainingOutputs
from launcher.plot import TrainingLog, curriculum, curriculum_curves, training_curves

DATA = Path(__file__).parent / "data" / "nemo_cpu_train_events"
PRINTED = json.loads((DATA / "printed.json").read_text())


def _run_with_events(tmp_path: Path, events: bool = True, name: str = "run") -> Path:
    """A run folder as the launcher lays it out: the training config names the event folder."""
    run, results = tmp_path / name, tmp_path / name / "training" / "results"
    results.mkdir(parents=True)
    if events:
        for path in DATA.glob("events.out.tfevents.*"):
            shutil.copy(path, results)
    config = {
        "trainer": {"num_nodes": 1, "devices": PRINTED["gpus"]},
        "exp_manager": {"explicit_log_dir": str(results), "create_tensorboard_logger": True},
        "model": {"global_batch_size": PRINTED["global_batch_size"]},
    }
    (run / "training" / "sd.yaml").write_text(yaml.safe_dump(config))
    return run


def test_curves_are_the_values_nemo_printed_by_its_step(tmp_path: Path) -> None:
    log = TrainingLog(DATA, PRINTED["global_batch_size"], PRINTED["gpus"])
    curves = training_curves(log)
    printed = {int(step): values for step, values in PRINTED["printed_by_step"].items()}
    assert [step for step, _ in curves["reduced_train_loss"]] == sorted(printed) == [1, 2, 3, 4]
    for step, loss in curves["reduced_train_loss"]:
        assert loss == pytest.approx(printed[step]["reduced_train_loss"], abs=6e-3)
    for step, lr in curves["lr"]:  # the preset's warm-up: linear in the step
        assert lr == pytest.approx(printed[step]["lr"], rel=1e-2)
        assert lr == pytest.approx(step * curves["lr"][0][1], rel=1e-6)
    for step, rate in curves["img/s per GPU"]:
        seconds = printed[step]["train_step_timing_s"]
        assert rate == pytest.approx(PRINTED["global_batch_size"] / seconds / PRINTED["gpus"], rel=2e-2)


def test_plot_command_writes_a_png(tmp_path: Path) -> None:
    run = _run_with_events(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "launcher", "plot", str(run)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    png = run / "plots" / "training.png"
    assert done.stdout.strip() == str(png)
    with Image.open(png) as image:
        assert image.format == "PNG" and image.width > 400 and image.height > 400


def test_plot_without_events_says_so(tmp_path: Path) -> None:
    run = _run_with_events(tmp_path, events=False)
    done = subprocess.run(
        [sys.executable, "-m", "launcher", "plot", str(run)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert "no TensorBoard events in" in done.stderr and not (run / "plots").exists()


def test_a_curriculum_is_plotted_stage_after_stage(tmp_path: Path) -> None:
    """A 512 px run started from a 256 px one (training.init_from): the 256 px steps first, then the 512 px
    steps after them; a stage without events is left out."""
    res256, res512 = _run_with_events(tmp_path, name="res256"), _run_with_events(tmp_path, name="res512")
    final = TrainingOutputs(res256).checkpoints / "sd--step=4-consumed_samples=8.0-last-EMA.ckpt"
    later = TrainingOutputs(res512)
    later.init_source.parent.mkdir(parents=True)
    later.init_source.write_text(f"{final}\n")  # what the init job records
    assert curriculum(res512) == [res256, res512] and curriculum(res256) == [res256]
    curves, stages = curriculum_curves(res512)
    assert stages == ((0, "res256"), (4, "res512"))
    assert [step for step, _ in curves["reduced_train_loss"]] == [1, 2, 3, 4, 5, 6, 7, 8]
    losses = [loss for _, loss in curves["reduced_train_loss"]]
    assert losses[:4] == losses[4:]  # the same events in both stages here
    done = subprocess.run(
        [sys.executable, "-m", "launcher", "plot", str(res512)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    for path in res256.rglob("events.out.tfevents.*"):
        path.unlink()
    assert curriculum_curves(res512)[1] == ((0, "res512"),)
