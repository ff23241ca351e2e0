"""`python -m launcher status`: one line per job at 100 columns with paths relative to the run
folder, `--watch` until every job has ended, and where training writes TensorBoard events (checked
against NeMo's own exp_manager)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, compose_config
from fixtures.launches import on_a_terminal, run_status
from omegaconf import OmegaConf

from launcher import manifest
from launcher.backends import prepare
from launcher.backends.slurm import SlurmBackend
from launcher.cli import launch
from launcher.job_states import JobStatus, Task, parse_sacct, parse_scontrol
from launcher.spec import JobSpec, Plan, Resources


@pytest.mark.parametrize("columns", [100, 250])
def test_a_finished_demo_run_shows_one_line_per_job_at_100_columns(demo_data: Path, columns: int) -> None:
    """The README's default command, run for real on the local backend (the session's demo_data), its
    status on a terminal."""
    command = [sys.executable, "-m", "launcher", "status", "results/sd_860m_res_256"]
    code, out = on_a_terminal(command, demo_data, columns)
    assert code == 0, out
    lines = [line.rstrip() for line in out.splitlines()]
    assert max(len(line) for line in lines) <= 100, out
    title, header = lines.index("run results/sd_860m_res_256"), lines.index("run results/sd_860m_res_256") + 1
    assert lines[header].split() == ["job", "id", "tasks", "by", "state", "exit", "newest", "log"]
    rows = lines[header + 1 : lines.index("", title)]
    jobs = [r.name for r in manifest.load(demo_data / "results/sd_860m_res_256")]
    assert [row.split()[0] for row in rows] == jobs and len(jobs) == 5, out
    for job, row in zip(jobs, rows, strict=True):
        assert row.split()[2:4] == [
            "COMPLETED",
            str(2 if job in ("download_images", "reorganize_tar") else 1),
        ]
        assert row.split()[-1].startswith(f"data_preparation/logs/{job}_"), row
    assert "tarfiles_reorganized/wdinfo.pkl: 11 tars x 20" in out


@pytest.mark.parametrize("columns", [None, "80", "200"])
def test_status_into_a_file_keeps_whole_lines(demo_data: Path, tmp_path: Path, columns: str | None) -> None:
    """`status ... > file`, whatever COLUMNS says: every log path whole, each data line on one line; the
    table keeps its columns (each row's log where the header says)."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | ({"COLUMNS": columns} if columns else {})
    run = demo_data / "results/sd_860m_res_256"
    with open(tmp_path / "status.txt", "w") as file:
        done = subprocess.run(
            [sys.executable, "-m", "launcher", "status", str(run)],
            cwd=REPO,
            stdout=file,
            env={**env, "PYTHONPATH": str(REPO)},
            timeout=120,
        )
    assert done.returncode == 0
    lines = (tmp_path / "status.txt").read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("job "))
    header, rows = lines[at], lines[at + 1 : lines.index("", at)]
    assert [row.split()[0] for row in rows] == [r.name for r in manifest.load(run)]
    column = header.index("newest log")
    logs = [row[column:].rstrip() for row in rows]
    assert all(log.startswith("data_preparation/logs/") and (run / log).is_file() for log in logs), logs
    chunking = next(
        line.rstrip() for line in lines[lines.index("", at) :] if line.startswith("reorganize_tar ")
    )
    # The demo's 234 images make 11 tars of 20: 14 left out, said on that one line.
    assert chunking.endswith(
        "220 samples, 0 samples dropped (missing a member), 14 left out by the chunking (fewer than a tar; "
        "data_preparation.reorganize_tar.keep_remainder=true keeps them)"
    ), chunking
    assert (
        "(`14 left out by the chunking (fewer than a tar; ...)`)" in (REPO / "docs/datasets.md").read_text()
    )


def test_logs_of_an_array_task(demo_data: Path) -> None:
    """`logs <run> <job> --task N`: that task's log; an array without it says which it showed; a task the
    job does not have, or --task on a job that is no array, is refused in one line (exit 2)."""
    run = str(demo_data / "results/sd_860m_res_256")

    def logs(*args: str) -> subprocess.CompletedProcess[str]:
        return run_status(run, *args, cwd=REPO, command="logs")

    for task in (0, 1):
        done = logs("download_images", "--task", str(task), "-n", "1")
        [header, _] = done.stdout.splitlines()
        assert done.returncode == 0 and header.endswith(f"_{task}.out <=="), done.stdout
        assert f"partition {task} done" in done.stdout
    done = logs("download_images", "-n", "1")
    assert (
        done.stderr == "download_images is an array (tasks 0-1): its newest task's log; another's: --task N\n"
    )
    for job, said in (("download_images", "its tasks are 0-1"), ("download_parquet", "it is not an array")):
        done = logs(job, "--task", "2")
        assert done.returncode == 2 and done.stderr == f"error: --task 2: {job} has no task 2; {said}\n"


def test_a_split_array_s_task_is_found_in_its_part() -> None:
    """An array submitted in parts (launcher.limits): each part numbers its tasks from 0."""
    record = manifest.JobRecord(
        "data_preparation", "fan", "8", "0-4", "s", "/r/fan_%A_%a.out", [], "slurm", ["8", "9"], 3
    )
    assert [record.part_of(task) for task in (0, 2, 3, 4)] == [("8", 0), ("8", 2), ("9", 0), ("9", 1)]
    assert (record.first_task("8"), record.first_task("9")) == (0, 3)
    whole = manifest.JobRecord("data_preparation", "fan", "8", "0-4", "s", "/r/fan_%A_%a.out", [], "slurm")
    assert (whole.part_of(4), whole.first_task("8")) == (("8", 4), 0)


def test_status_shows_no_training_lines_without_a_training_job(planned_training: Path) -> None:
    """A data-only plan in a folder that holds an earlier plan's training config: no TensorBoard line."""
    launch(
        compose_config(
            [
                "cluster=aws_p5",
                "stages=[data_preparation]",
                "dry_run=true",
                f"cluster.shared_dir={planned_training}",
                f"container.mounts=[{planned_training}:{planned_training}]",
            ]
        )
    )
    assert (planned_training / "results/sd_860m_res_256/training/sd_860m_res_256.yaml").exists()
    done = run_status("results/sd_860m_res_256", cwd=planned_training)
    assert done.returncode == 0 and "download_images " in done.stdout, done.stderr
    assert "TensorBoard" not in done.stdout and "tensorboard" not in done.stdout, done.stdout


def test_watch_of_a_finished_run_prints_once_and_ends(demo_data: Path) -> None:
    done = run_status(str(demo_data / "results/sd_860m_res_256"), "--watch", "--interval", "0.2", cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("make_demo_source ") == 1


@pytest.mark.slow
def test_watch_refreshes_until_the_running_job_ends(slurm_cluster, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    with tempfile.TemporaryDirectory(prefix="watch-", dir="/tmp") as tmp:  # readable by the Slurm daemons
        run = Path(tmp) / "run"
        sleeper = JobSpec(
            stage="toy", name="sleeper", argv=("sleep", "4"), resources=Resources(mem="100M", time="00:05:00")
        )
        ids = SlurmBackend().schedule(prepare(Plan(run_dir=run, jobs=(sleeper,))))
        done = run_status(str(run), "--watch", "--interval", "0.5", cwd=REPO)
        assert done.returncode == 0, done.stderr
        frames = [line for line in done.stdout.splitlines() if line.startswith("sleeper ")]
        assert len(frames) >= 2 and ("RUNNING" in frames[0] or "PENDING" in frames[0]), done.stdout
        assert "COMPLETED 1" in frames[-1]
        assert slurm_cluster.wait_job(ids["sleeper"], timeout=5).state == "COMPLETED"


@pytest.fixture
def planned_training(tmp_path: Path) -> Iterator[Path]:
    launch(
        compose_config(
            [
                "cluster=aws_p5",
                "stages=[data_preparation,training]",
                "dry_run=true",
                f"cluster.shared_dir={tmp_path}",
                f"container.mounts=[{tmp_path}:{tmp_path}]",
            ]
        )
    )
    yield tmp_path


def test_status_says_where_tensorboard_events_go_and_how_to_open_them(planned_training: Path) -> None:
    done = run_status("results/sd_860m_res_256", cwd=planned_training)
    assert done.returncode == 0, done.stderr
    assert "TensorBoard events: training/results (0 event file(s) so far)" in done.stdout
    assert "  open them: tensorboard --logdir results/sd_860m_res_256/training/results" in done.stdout


PROBE_EXP_MANAGER = """
import sys
from lightning.pytorch import Trainer
from omegaconf import OmegaConf
from nemo.utils.exp_manager import exp_manager

cfg = OmegaConf.load(sys.argv[1])
trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, max_steps=1)
exp_manager(trainer, {**cfg.exp_manager, "create_checkpoint_callback": False, "create_wandb_logger": False,
                      "ema": {"enable": False}})
trainer.logger.log_metrics({"reduced_train_loss": 1.0}, step=0)
trainer.logger.finalize("success")
"""


def test_nemo_writes_tensorboard_events_where_status_says(planned_training: Path, nemo_python: str) -> None:
    """NeMo's exp_manager, given the exp_manager section of the config the launcher wrote, puts its
    TensorBoard event files in the folder `status` names."""
    config = planned_training / "results/sd_860m_res_256/training/sd_860m_res_256.yaml"
    assert OmegaConf.load(config).exp_manager.create_tensorboard_logger
    subprocess.run(
        [nemo_python, "-c", PROBE_EXP_MANAGER, str(config)],
        cwd=planned_training,
        check=True,
        capture_output=True,
        timeout=300,
    )
    done = run_status("results/sd_860m_res_256", cwd=planned_training)
    assert "TensorBoard events: training/results (1 event file(s) so far)" in done.stdout
    assert list((planned_training / "results/sd_860m_res_256/training/results").glob("events.out.tfevents.*"))


def test_sacct_and_scontrol_lines_give_each_tasks_state_and_start() -> None:
    """sacct's --parsable2 lines (steps skipped, a pending array range counted, `CANCELLED by <uid>`) and
    scontrol's: a task that started has its start, a pending one's estimate is no start."""
    sacct = (
        "12|COMPLETED|0:0|2026-11-28T07:52:27\n12.batch|COMPLETED|0:0|2026-11-28T07:52:27\n"
        "13_[2-5%2]|PENDING|0:0|2026-11-29T01:00:00\n13_0|RUNNING|0:0|2026-11-28T07:54:43\n"
        "14|CANCELLED by 0|0:15|None\n"
    )
    found = parse_sacct(sacct)
    assert found["12"] == [Task("COMPLETED", "0:0", "2026-11-28T07:52:27")]
    pending = [Task("PENDING", "0:0", None, i) for i in range(2, 6)]
    assert found["13"] == [*pending, Task("RUNNING", "0:0", "2026-11-28T07:54:43", 0)]
    assert found["14"] == [Task("CANCELLED", "0:15")]
    shown = "JobId=3 ArrayJobId=2 ArrayTaskId=0 JobState=RUNNING ExitCode=0:0 StartTime=2026-11-28T07:54:43\n"
    shown += "JobId=2 ArrayJobId=2 ArrayTaskId=2-5%2 JobState=PENDING ExitCode=0:0 StartTime=Unknown\n"
    assert parse_scontrol(shown) == [Task("RUNNING", "0:0", "2026-11-28T07:54:43", 0), *pending]
    record = manifest.JobRecord("toy", "fan", "2", "0-5%2", "s", "l", [], "slurm")
    running = JobStatus(record, Counter({"RUNNING": 1, "PENDING": 4}), started="2026-11-28T07:54:43")
    assert running.summary() == "PENDING 4, RUNNING 1 since 11-28 07:54"
