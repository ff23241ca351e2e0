"""bench_goodput.py's pure parts, on hand-made records (the benchmark itself runs NeMo on the Slurm cluster
for many minutes: it is run by hand, never in the suite): the figures and the table
(benchmarks/goodput_table.py), the progress read from NeMo's bar, the stand-in's reading of nvidia-smi."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from fixtures.ranks import steps_done

REPO = Path(__file__).resolve().parents[1]


def _module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


table = _module("goodput_table")


def _base() -> table.Run:
    """Fault-free: one job held 90 s by 2 GPUs (180 GPU-s), 100 s from launch to its end."""
    return table.Run("ok", table.TODAY, 0.0, 100.0, 2, 6, 6, [table.Job("1", "COMPLETED", 5.0, 95.0, "n1")])


def _killed() -> table.Run:
    """Killed at step 3 (t=50), the part ended at 70, the next resumed from step 2 at 100 and finished."""
    jobs = [table.Job("2", "FAILED", 5.0, 70.0, "n1"), table.Job("3", "COMPLETED", 72.0, 120.0, "n1")]
    return table.Run(
        "kill", table.TODAY, 0.0, 125.0, 2, 6, 6, jobs, 50.0, 70.0, 100.0, 3, 2, outcome="finished"
    )


def test_figures_of_a_fault_against_the_baseline() -> None:
    f = table.figures(_killed(), _base())
    assert (f.detect_s, f.resumed_s, f.steps_lost, f.wall_s) == (20.0, 50.0, 1, 125.0)
    assert f.goodput == pytest.approx(100 / 125)
    assert (f.gpu_s, f.idle_gpu_s) == (2 * (65 + 48), 2 * (65 + 48) - 180)
    assert table.figures(_base(), _base()) == table.Figures(None, None, None, 100.0, 1.0, 180.0, 0.0)


def test_a_run_that_never_trains_idles_every_gpu_second_it_held() -> None:
    jobs = [table.Job(str(i), "FAILED", 2.0 + 3 * i, 4.0 + 3 * i) for i in range(3)]
    crash = table.Run("crash", table.TODAY, 0.0, 30.0, 2, 6, 0, jobs, fault_at=2.0, steps_at_fault=0)
    f = table.figures(crash, _base())
    assert (f.detect_s, f.steps_lost, f.goodput, f.gpu_s, f.idle_gpu_s) == (None, 0, 0.0, 12.0, 12.0)


def test_the_table_puts_both_modes_side_by_side_each_against_its_own_fault_free_run() -> None:
    base = _base()
    base.mode, base.ended, base.jobs = table.RECOVERY, 80.0, [table.Job("4", "COMPLETED", 5.0, 75.0, "n1")]
    recovered = _killed()
    recovered.mode, recovered.ended, recovered.detected_at, recovered.restarts = (
        table.RECOVERY,
        110.0,
        51.0,
        1,
    )
    recovered.jobs = [table.Job("5", "COMPLETED", 5.0, 105.0, "n2")]
    titles = {"ok": "no fault", "kill": "rank 1 killed", "x": "x"}
    text = table.markdown([_base(), base, _killed(), recovered], titles)
    # today's against 100 s and 180 GPU-s; the recovery's against 80 s and 140 GPU-s
    assert "| rank 1 killed | 20 / 1 | 50 / 50 | 1 / 1 | 125 / 110 | 0.80 / 0.73 | 46 / 60 |" in text
    assert "| no fault | - / - | - / - | - / - | 100 / 80 | 1.00 / 1.00 | 0 / 0 |" in text
    assert "| x | n/a / n/a |" in text
    assert (
        f"| rank 1 killed | {table.RECOVERY} | finished | 1: completed on n2 | 1 | 6/6 | 200 | 0.0 |" in text
    )
    no_recovery = table.markdown([_base(), _killed()], titles)
    assert (
        "| rank 1 killed | 20 / n/a | 50 / n/a | 1 / n/a | 125 / n/a | 0.80 / n/a | 46 / n/a |" in no_recovery
    )


def test_steps_done_reads_the_counter_of_nemo_s_bar() -> None:
    # As NeMo 2.4.1 draws it on CPU (redrawn with \r), after a resume from step 2.
    log = (
        "Epoch 0: :   0%|          | 0/4 [00:00<?]\r"
        "Epoch 0: :  75%|███████▌  | 3/4 [00:01<00:00, reduced_train_loss=0.524, global_step=3.000]\r"
        "[NeMo I 2026-11-28 11:20:40 nemo_logging:393] Removing checkpoint: x-step=2-last.ckpt\n"
    )
    assert steps_done(log) == 3
    assert steps_done("no bar") == 0
    # Ranks restarted in the same job after step 4 (the same log): the first attempt's step.
    restarted = "Epoch 0: :  67%|██████▋   | 4/6 [00:07<00:03]\rEpoch 0: :   0%|          | 0/6 [00:00<?]\r"
    assert steps_done(log + restarted + "Epoch 0: :  83%|████████▎ | 5/6 [00:01<00:00]\n") == 4


def test_the_bad_gpu_stand_in_reads_the_node_check_s_query() -> None:
    bad_gpu = _module("goodput_bad_gpu")
    answer = "0, 00000000:10:00.0, 0\n3, 00000000:13:00.0, 12\n4, 00000000:14:00.0, [N/A]\n"
    assert bad_gpu.failing_gpus(answer) == ["3, 00000000:13:00.0, 12"]
    assert bad_gpu.failing_gpus("0, 00000000:10:00.0, 0\n") == []
