"""launcher.throughput against NeMo SD training logs: a sample in the real format and a live run of
NeMo's own progress bar under Lightning."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from launcher.throughput import read_training_progress, step_timings

SAMPLE = Path(__file__).resolve().parent / "data" / "nemo_train_log.txt"
GBS, GPUS = 8192, 64  # what the sample run used: 8 nodes x 8 GPUs, global batch 8192


def _sample_text() -> str:
    return SAMPLE.read_bytes().decode("utf-8")  # bytes: read_text() would turn tqdm's \r into \n


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "slurm-1234.out"
    path.write_bytes(text.encode("utf-8"))
    return path


def test_sample_log_gives_newest_redraw() -> None:
    progress = read_training_progress(SAMPLE, GBS, GPUS)
    assert progress is not None
    assert (progress.epoch, progress.last_step, progress.total_steps) == (0, 300, 82500)
    assert progress.loss == pytest.approx(0.118)
    assert progress.lr == pytest.approx(2.46e-6)
    assert progress.step_time_s == pytest.approx(1.21)
    # tqdm printed 2.46e+6 for 300 * 8192 = 2457600: three significant digits.
    assert progress.consumed_samples == pytest.approx(300 * GBS, rel=0.01)
    assert progress.samples_per_s == pytest.approx(GBS / 1.21)
    assert progress.samples_per_s_per_gpu == pytest.approx(GBS / 1.21 / GPUS)


def test_no_finished_step_gives_none(tmp_path: Path) -> None:
    text = _sample_text()
    first_step = text.index("\rEpoch 0: :   0%|          | 1/82500")
    assert read_training_progress(_write(tmp_path, text[:first_step]), GBS, GPUS) is None
    assert read_training_progress(_write(tmp_path, ""), GBS, GPUS) is None


def test_truncated_last_redraw_falls_back_to_previous_one(tmp_path: Path) -> None:
    text = _sample_text()
    last_start = text.rindex("\r") + 1
    # Cut the newest redraw at several points, as a reader racing the writer would see it.
    for cut in (last_start + 5, last_start + 80, len(text) - 20, len(text) - 1):
        progress = read_training_progress(_write(tmp_path, text[:cut]), GBS, GPUS)
        assert progress is not None
        # The redraw before the newest one shows step 300's counter with step 299's metrics.
        assert (progress.last_step, progress.loss) == (299, pytest.approx(0.144)), cut


def test_long_output_after_the_bar_is_skipped(tmp_path: Path) -> None:
    frame = '  File "/opt/NeMo/nemo/x{0}.py", line {0}, in f\n    raise RuntimeError\n'
    traceback = "".join(frame.format(i) for i in range(5000))
    path = _write(tmp_path, _sample_text() + "\nTraceback (most recent call last):\n" + traceback)
    assert path.stat().st_size > 300_000  # beyond the first tail window: the reader must grow it
    progress = read_training_progress(path, GBS, GPUS)
    assert progress is not None and progress.last_step == 300


def test_srun_label_and_older_lightning_postfix(tmp_path: Path) -> None:
    line = (
        "0: Epoch 3: : 1200it [20:00, 1.00it/s, loss=0.123, v_num=a1b2, reduced_train_loss=0.121, "
        "global_step=1199.0, consumed_samples=9.82e+6, train_step_timing in s=4.87]"
    )
    progress = read_training_progress(_write(tmp_path, "noise\n" + line + "\n"), 4096, 16)
    assert progress is not None
    assert (progress.epoch, progress.last_step, progress.total_steps) == (3, 1199, None)
    assert progress.loss == pytest.approx(0.121)  # NeMo's reduced loss wins over Lightning's running loss
    assert progress.consumed_samples == 9_820_000
    assert progress.samples_per_s_per_gpu == pytest.approx(4096 / 4.87 / 16)


def test_redraw_without_step_timing_has_no_throughput(tmp_path: Path) -> None:
    line = "\rEpoch 0: :   0%|          | 7/100 [00:10<02:00, reduced_train_loss=0.2, global_step=7.000]"
    progress = read_training_progress(_write(tmp_path, line), 64, 8)
    assert progress is not None and progress.last_step == 7
    assert progress.step_time_s is None
    assert progress.samples_per_s is None and progress.samples_per_s_per_gpu is None


@pytest.mark.parametrize(("gbs", "gpus", "name"), [(0, 8, "global_batch_size"), (64, 0, "num_gpus")])
def test_bad_arguments_name_the_argument(gbs: int, gpus: int, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        read_training_progress(SAMPLE, gbs, gpus)


# A Lightning run on CPU with NeMo's own progress bar and timing callback, logging the keys that
# MegatronLatentDiffusion logs with prog_bar=True: the bytes NeMo really writes to a Slurm log.
_LIVE_RUN = """
import sys
import time
import lightning.pytorch as pl
import torch
from nemo.collections.nlp.parts.nlp_overrides import CustomProgressBar
from nemo.utils.exp_manager import TimingCallback

GBS, STEPS = int(sys.argv[1]), int(sys.argv[2])
# Optional seconds each step sleeps, comma-separated: steps of known minimum duration.
SLEEPS = [float(s) for s in sys.argv[3].split(",")] if len(sys.argv) > 3 else [0.0] * STEPS

class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def training_step(self, batch, idx):
        loss = self.lin(batch[0]).pow(2).mean()
        step = self.trainer.global_step + 1
        time.sleep(SLEEPS[step - 1])
        for key, value in (("reduced_train_loss", loss), ("lr", self.optimizers().param_groups[0]["lr"]),
                           ("global_step", step), ("consumed_samples", float(step * GBS))):
            self.log(key, value, prog_bar=True, rank_zero_only=True, batch_size=1)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=8.192e-5)

data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(256, 4)), batch_size=2)
# In NeMo's order: exp_manager inserts its TimingCallback before the trainer builder's progress bar.
trainer = pl.Trainer(max_steps=STEPS, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                     enable_model_summary=False, callbacks=[TimingCallback(), CustomProgressBar()])
trainer.fit(Model(), data)
"""


def _live_log(nemo_python: str, tmp_path: Path, gbs: int, steps: int, *sleeps: float) -> Path:
    """The log of _LIVE_RUN under NeMo's interpreter, stdout and stderr in one file as Slurm writes them."""
    script = tmp_path / "live_run.py"
    script.write_text(_LIVE_RUN, encoding="utf-8")
    log = tmp_path / "slurm-live.out"
    extra = [",".join(map(str, sleeps))] if sleeps else []
    with log.open("wb") as out:
        subprocess.run(
            [nemo_python, str(script), str(gbs), str(steps), *extra],
            stdout=out,
            stderr=out,
            check=True,
            timeout=300,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    return log


@pytest.mark.slow
def test_real_nemo_progress_bar_is_parsed(nemo_python: str, tmp_path: Path) -> None:
    steps, gbs = 37, 4096
    log = _live_log(nemo_python, tmp_path, gbs, steps)
    assert b"\r" in log.read_bytes()  # tqdm redraws, not one line per step
    progress = read_training_progress(log, gbs, 2)
    assert progress is not None
    assert (progress.last_step, progress.total_steps) == (steps, steps)
    assert progress.consumed_samples == pytest.approx(steps * gbs, rel=0.01)
    assert progress.lr == pytest.approx(8.192e-5, rel=0.01)
    assert progress.loss is not None and progress.step_time_s is not None and progress.step_time_s > 0
    assert progress.samples_per_s == pytest.approx(gbs / progress.step_time_s)


def test_status_shows_training_progress_from_the_log(tmp_path: Path) -> None:
    """`python -m launcher status` reads the training job's newest log with the saved NeMo config."""
    from launcher import manifest as run_manifest
    from launcher.stages.training_status import training_progress

    run = tmp_path / "run"
    logs = run / "training" / "logs"
    logs.mkdir(parents=True)
    (run / "training" / "sd.yaml").write_text(
        "trainer: {num_nodes: 8, devices: 8}\nmodel: {global_batch_size: 8192}\n"
    )
    (logs / "sd_77.out").write_bytes((Path(__file__).parent / "data" / "nemo_train_log.txt").read_bytes())
    record = run_manifest.JobRecord(
        stage="training",
        name="sd",
        job_id="77",
        array=None,
        script=str(run / "training" / "sd.sbatch"),
        log_pattern=str(logs / "sd_%j.out"),
        depends_on=[],
        backend="slurm",
    )
    run_manifest.save(run, [record])
    [line] = training_progress(run)
    assert line.startswith("sd: step ") and "samples/s" in line and "64 GPUs" in line


@pytest.mark.slow
def test_step_timings_of_nemo_bar_are_in_step_order(nemo_python: str, tmp_path: Path) -> None:
    """Steps sleep known, decreasing minimum times; NeMo's TimingCallback times them and its bar prints
    them. Each parsed timing must be at least its own step's sleep: a list shifted by one step (a later,
    shorter step's timing in an earlier step's place) fails that bound, a missing or doubled step the count."""
    sleeps = (0.6, 0.5, 0.4, 0.3, 0.2, 0.1)
    timings = step_timings(
        _live_log(nemo_python, tmp_path, 8, len(sleeps), *sleeps).read_bytes().decode("utf-8")
    )
    assert len(timings) == len(sleeps)
    for step, (timing, slept) in enumerate(zip(timings, sleeps, strict=True), start=1):
        assert timing >= slept, (step, timings)


def test_step_timings_of_nemo_sd_training_match_its_tensorboard_scalars() -> None:
    """A log NeMo's own SD training wrote (tests/data/nemo_cpu_bench_task.tb.json says how), against the
    per-step timings NeMo logged to TensorBoard in the same run."""
    data = Path(__file__).resolve().parent / "data"
    expected = json.loads((data / "nemo_cpu_bench_task.tb.json").read_text())["train_step_timing_s"]
    timings = step_timings((data / "nemo_cpu_bench_task.log").read_bytes().decode("utf-8"))
    assert timings == pytest.approx(expected, rel=5e-3)  # tqdm prints 3 significant digits
