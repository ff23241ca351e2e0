"""One writer per data folder, across run_names: the local lock, the Slurm writers' records, and three
demo launches at once on one data folder."""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO
from fixtures.slurm import launch_demo

from launcher import data_owner, manifest
from launcher.errors import LauncherError
from launcher.job_states import status
from launcher.spec import JobSpec, Plan, Resources
from launcher.status.cli import main


def _plan(run_dir: Path, *stages: str) -> Plan:
    jobs = tuple(JobSpec(stage=s, name=f"{s}_job", argv=("true",), resources=Resources()) for s in stages)
    return Plan(run_dir=run_dir, jobs=jobs)


HOLD = """
import sys, time
from pathlib import Path
from launcher import data_owner
from launcher.spec import JobSpec, Plan, Resources
plan = Plan(run_dir=Path(sys.argv[2]), jobs=(JobSpec("data_preparation", "download_images", ("true",), Resources()),))
with data_owner.claim(sys.argv[1], plan, "local", dry_run=False):
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_local_writer_holds_the_data_folder_until_it_ends_even_by_kill_9(tmp_path: Path) -> None:
    data, first, second = tmp_path / "data", tmp_path / "results/first", tmp_path / "results/second"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(data), str(first)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        for stages, dry in (
            (("data_preparation",), False),
            (("training",), False),
            (("rehearsal",), False),  # it reads the data too (StageSpec.data_role)
            (("data_preparation",), True),
        ):
            with (
                pytest.raises(LauncherError) as refused,
                data_owner.claim(str(data), _plan(second, *stages), "local", dry_run=dry),
            ):
                pass
            message = str(refused.value)
            assert (
                f"data folder {data} is being written by run {first} (pid {holder.pid}, local backend"
                in message
            )
            assert "jobs download_images" in message and f"python -m launcher cancel {first}" in message
            doing = "write into the folders they are writing" if "data_preparation" in stages else "read data"
            assert f"This launch would {doing}" in message
        # A plan that neither writes nor reads the data folder is not concerned.
        with data_owner.claim(str(data), _plan(second, "samples"), "local", dry_run=False):
            pass
    finally:
        holder.kill()  # kill -9: the kernel drops the lock with the process
        holder.wait()
    with data_owner.claim(str(data), _plan(second, "data_preparation"), "local", dry_run=False):
        pass


def test_a_writer_records_its_jobs_and_finished_writers_block_no_one(tmp_path: Path) -> None:
    data, run = tmp_path / "data", tmp_path / "results/a"
    plan = _plan(run, "data_preparation", "training")
    with data_owner.claim(str(data), plan, "local", dry_run=False):
        run.mkdir(parents=True)
        manifest.save(
            run,
            [
                manifest.JobRecord(j.stage, j.name, f"7{i}", None, "s", "l", [], "local")
                for i, j in enumerate(plan.jobs)
            ],
        )
    (record,) = data_owner.writers(data)
    assert record["run_dir"] == str(run) and record["backend"] == "local"
    assert record["jobs"] == {"data_preparation_job": "70"}  # its data jobs only
    assert data_owner.record_path(data, run).exists()
    for stages in (("training",), ("data_preparation",)):  # the writer ended: no one is refused
        with data_owner.claim(str(data), _plan(tmp_path / "results/b", *stages), "local", dry_run=False):
            pass


def test_a_dry_run_writes_nothing_into_the_data_folder(tmp_path: Path) -> None:
    with data_owner.claim(
        str(tmp_path / "data"), _plan(tmp_path / "r", "data_preparation"), "slurm", dry_run=True
    ):
        pass
    assert not (tmp_path / "data").exists()


def _total(data: Path) -> int:
    with open(data / "tarfiles_reorganized/wdinfo.pkl", "rb") as f:
        return pickle.load(f)["total_key_count"]


@pytest.mark.slow
def test_three_demo_launches_at_once_on_one_data_folder(tmp_path: Path) -> None:
    """The README's default command under three run_names, started together: each one finishes or is
    refused naming another run, and the data is exact."""
    names = ("first", "second", "third")
    launches = [
        subprocess.Popen(
            [
                sys.executable,
                "launcher/main.py",
                f"cluster.shared_dir={tmp_path}",
                f"container.python={sys.executable}",
                f"run_name={name}",
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in names
    ]
    outcomes = [p.communicate(timeout=600) for p in launches]
    finished = [n for n, p in zip(names, launches, strict=True) if p.returncode == 0]
    assert finished, outcomes
    for name, launched, (_, err) in zip(names, launches, outcomes, strict=True):
        if launched.returncode != 0:
            others = [str(tmp_path / "results" / n) for n in names if n != name]
            assert launched.returncode == 2 and "is being written by run" in err, err
            assert any(f"run {other} " in err for other in others), err
    assert _total(tmp_path / "data") == 220
    recorded = {Path(w["run_dir"]).name for w in data_owner.writers(tmp_path / "data")}
    assert recorded == set(finished)


@pytest.mark.slow
def test_a_second_run_on_the_data_folder_is_refused_while_the_first_ones_jobs_pend(
    slurm_cluster,
    slurm_shared: Path,
    drained: None,
) -> None:
    first = launch_demo(slurm_shared)
    run_a = slurm_shared / "results/sd_860m_res_256"
    (record,) = data_owner.writers(slurm_shared / "data")
    assert record["run_dir"] == str(run_a) and record["jobs"] == first and record["backend"] == "slurm"
    for extra in ([], ["dry_run=true"]):
        with pytest.raises(LauncherError) as refused:
            launch_demo(slurm_shared, "run_name=second", *extra)
        message = str(refused.value)
        assert f"is being written by run {run_a}: its jobs" in message, message
        assert all(f"{name} (job {job_id}: PENDING)" in message for name, job_id in first.items()), message
        assert f"python -m launcher cancel {run_a}" in message and "data_dir=" in message
        assert "This launch would write into the folders they are writing. Wait until they end" in message
        assert not (slurm_shared / "results/second/manifest.json").exists()
    slurm_cluster.run_command(["scancel", *first.values()])
    for job_id in first.values():
        slurm_cluster.wait_job(job_id, timeout=30)
    launch_demo(slurm_shared, "run_name=second")  # A's jobs ended (cancelled): B may write
    run_b = slurm_shared / "results/second"
    second = {r.name: r.job_id for r in manifest.load(run_b)}
    slurm_cluster.run_command(["scancel", *second.values()])
    assert {w["run_dir"]: w["jobs"] for w in data_owner.writers(slurm_shared / "data")} == {
        str(run_a): first,
        str(run_b): second,
    }


@pytest.mark.slow
def test_the_refusals_advice_to_cancel_a_local_writer_stops_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's default command (local backend) running: `status` shows its running job RUNNING, a
    second writer is refused naming `cancel`, and that cancel stops the demo: its jobs end CANCELLED, and
    the data folder is free again."""
    run, data = tmp_path / "results/first", tmp_path / "data"
    demo = subprocess.Popen(
        [
            sys.executable,
            "launcher/main.py",
            f"cluster.shared_dir={tmp_path}",
            f"container.python={sys.executable}",
            "run_name=first",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (run / manifest.MANIFEST).exists() or not any("RUNNING" in st.states for st in status(run)):
            assert demo.poll() is None and time.monotonic() < deadline, demo.communicate()
            time.sleep(0.1)
        assert main(["status", str(run)]) == 0
        assert re.search(r"(?m)^\w+ +\d+ +RUNNING 1 since ", capsys.readouterr().out)
        with (
            pytest.raises(LauncherError) as refused,
            data_owner.claim(
                str(data), _plan(tmp_path / "results/second", "data_preparation"), "local", False
            ),
        ):
            pass
        assert f"cancel them (python -m launcher cancel {run})" in str(refused.value)
        assert main(["cancel", str(run)]) == 0
        assert capsys.readouterr().out.startswith("cancelled ")
        _, err = demo.communicate(timeout=60)
    finally:
        demo.kill()
        demo.wait()
    assert demo.returncode == 143 and "local run cancelled: " in err, err  # as SIGTERM's (launcher.errors)
    states = {st.record.name: st for st in status(run)}
    assert not any(st.active for st in states.values())
    assert any("CANCELLED" in st.states for st in states.values()), {
        n: s.summary() for n, s in states.items()
    }
    with data_owner.claim(str(data), _plan(tmp_path / "results/second", "data_preparation"), "local", False):
        pass
