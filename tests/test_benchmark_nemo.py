"""A real benchmark sweep on the local backend: NeMo's own SD training on CPU at tiny sizes (2 micro
batch sizes, 4 steps each), the report's numbers taken from NeMo's log and checked against the
per-step timings NeMo wrote to TensorBoard in the same run; then an SDXL sweep the same way (NeMo's
sd_xl_train on the demo's tars: SDXL has no synthetic data).

Only sizes, asset paths and the device differ from what users get (tests/nemo_cpu/tiny.py); the
CUDA/apex-only calls patched are listed in tests/nemo_cpu/sd_train_cpu.py. Test-only: the trainer logs
every step (log_every_n_steps=1) so that TensorBoard holds each step's timing to compare with."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import compose_config
from nemo_cpu.harness import SD_TRAIN_CPU, SD_XL_TRAIN_CPU
from nemo_cpu.tiny import SDXL_OVERRIDES, TINY_OVERRIDES

from launcher.cli import launch
from launcher.throughput import step_timings

pytestmark = pytest.mark.slow
STEPS, WARMUP = 4, 1

_TENSORBOARD = """
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
events = EventAccumulator(sys.argv[1])
events.Reload()
print(json.dumps([e.value for e in events.Scalars("train_step_timing in s")]))
"""


def _tensorboard_timings(nemo_python: str, log_dir: Path) -> list[float]:
    done = subprocess.run(
        [nemo_python, "-c", _TENSORBOARD, str(log_dir)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def _check_timings(nemo_python: str, row: dict, nemo_dir: Path) -> None:
    """The row's step time and throughput are NeMo's own timings, as TensorBoard holds them."""
    logged = _tensorboard_timings(nemo_python, nemo_dir)
    assert len(logged) == STEPS
    assert step_timings(Path(row["log"]).read_bytes().decode("utf-8")) == pytest.approx(logged, rel=5e-3)
    mean = sum(logged[WARMUP:]) / (STEPS - WARMUP)
    assert row["step_time_s"] == pytest.approx(mean, rel=5e-3)
    assert row["img_s_per_gpu"] == pytest.approx(row["micro_batch_size"] / mean, rel=5e-3)


def test_cpu_sweep_report_comes_from_nemo_logs(new_shared, nemo_python: str) -> None:
    tmp_path = new_shared("models")
    run = launch(
        compose_config(
            [
                "cluster=local",
                f"cluster.shared_dir={tmp_path}",
                "stages=[benchmark]",
                "assets.enable=false",
                *TINY_OVERRIDES,
                "benchmark.micro_batch_sizes=[1,2]",
                "benchmark.inputs=[images,latents]",
                f"benchmark.max_steps={STEPS}",
                f"benchmark.warmup_steps={WARMUP}",
                f"training.run.script={SD_TRAIN_CPU}",
                f"training.run.python={nemo_python}",
                "training.trainer.log_every_n_steps=1",
            ]
        )
    )
    report = json.loads((run / "benchmark/report.json").read_text())
    assert [(r["micro_batch_size"], r["inputs"]) for r in report["rows"]] == [
        (1, "images"),
        (2, "images"),
        (1, "latents"),
        (2, "latents"),
    ]
    for row in report["rows"]:
        nemo_dir = run / "benchmark/tasks" / row["case"] / "nemo"
        # NeMo ran the task's own config: its batch, no checkpoints, its own log folder.
        hparams = yaml.safe_load((nemo_dir / "hparams.yaml").read_text())["cfg"]
        assert (hparams["micro_batch_size"], hparams["global_batch_size"]) == (row["micro_batch_size"],) * 2
        assert hparams["data"]["synthetic_data"] is True and not (nemo_dir / "checkpoints").exists()
        # NeMo's synthetic data in the form the case names: moments and text embeddings for latents.
        keys = ("image_encoded", "captions_encoded") if row["inputs"] == "latents" else ("images", "captions")
        assert (hparams["first_stage_key"], hparams["cond_stage_key"]) == keys
        assert (row["latents_vs_images"] is not None) == (row["inputs"] == "latents")
        assert (row["status"], row["steps_done"], row["steps_measured"]) == ("ok", STEPS, STEPS - WARMUP)
        assert (row["gpu"], row["peak_gpu_mib"]) == ("n/a", None)  # no nvidia-smi here
        _check_timings(nemo_python, row, nemo_dir)
    markdown = (run / "benchmark/report.md").read_text()
    assert f"first {WARMUP} steps of every task are excluded" in markdown
    assert "| n/a | 1 | 1 | 2 | 2 | images |" in markdown and "| n/a | ok |" in markdown
    assert "| n/a | 1 | 1 | 2 | 2 | latents |" in markdown
    assert (run / "benchmark/throughput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(markdown)  # pytest -s shows the table (the README's CPU example is such a run)


def test_sdxl_sweep_report_comes_from_nemos_sd_xl_train_logs(new_shared, nemo_python: str) -> None:
    """The 256 px SDXL preset swept at one micro batch size on the demo's tars (its data folder)."""
    shared = new_shared()
    (shared / "data_sdxl_256").symlink_to("data")
    run = launch(
        compose_config(
            [
                "cluster=local",
                f"cluster.shared_dir={shared}",
                "stages=[benchmark]",
                "assets.enable=false",
                "training=sdxl/sdxl_base_train_res_256_stage_1",
                "data_preparation.precache.enable=false",
                *SDXL_OVERRIDES,
                "benchmark.micro_batch_sizes=[1]",
                "benchmark.synthetic_data=false",
                f"benchmark.max_steps={STEPS}",
                f"benchmark.warmup_steps={WARMUP}",
                f"training.run.script={SD_XL_TRAIN_CPU}",
                f"training.run.python={nemo_python}",
                "training.trainer.log_every_n_steps=1",
            ]
        )
    )
    (row,) = json.loads((run / "benchmark/report.json").read_text())["rows"]
    assert (row["micro_batch_size"], row["status"], row["steps_done"]) == (1, "ok", STEPS)
    nemo_dir = run / "benchmark/tasks" / row["case"] / "nemo"
    hparams = yaml.safe_load((nemo_dir / "hparams.yaml").read_text())["cfg"]
    # NeMo's SDXL engine ran the task's own config on the prepared tars, without checkpoints.
    assert (hparams["micro_batch_size"], hparams["global_batch_size"]) == (1, 1)
    assert hparams["data"]["train"]["dataset_path"] == [
        str(shared / "data_sdxl_256/tarfiles_reorganized/wdinfo.pkl")
    ]
    assert not (nemo_dir / "checkpoints").exists()
    _check_timings(nemo_python, row, nemo_dir)
