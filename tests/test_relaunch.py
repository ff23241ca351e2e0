"""A live run is never submitted twice: the launch lock, the refusal while jobs are queued, and
`resubmit=missing`, on the real Slurm test cluster and the local backend."""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, compose_config
from fixtures.slurm import launch_demo

from launcher import manifest
from launcher.cli import launch
from launcher.errors import LauncherError
from launcher.relaunch import COMPLETED, LIVE, LOCK_NAME, MISSING, decide, run_lock

CHAIN = {"a": (), "b": ("a",), "c": ("b",), "d": ("c",)}
# The demo at 40 images, not 240, on the local backend: still two partitions, two download tasks.
SMALL_DEMO = "data_preparation.demo.num_images=40"


def test_decide_submits_what_did_not_complete_and_everything_after_it() -> None:
    chosen = decide({"a": COMPLETED, "b": COMPLETED, "c": MISSING, "d": MISSING}, CHAIN, {"a": "1", "b": "2"})
    assert chosen.submit == ("c", "d") and chosen.keep == {}
    assert chosen.dropped_edges == {"c": ("b",)}  # a completed job may have left Slurm's memory


def test_decide_waits_on_live_jobs_by_their_ids() -> None:
    chosen = decide(
        {"a": COMPLETED, "b": LIVE, "c": LIVE, "d": MISSING}, CHAIN, {"b": "12", "c": "13", "d": "14"}
    )
    assert chosen.submit == ("d",) and chosen.keep == {"b": "12", "c": "13"} and chosen.dropped_edges == {}


def test_decide_never_submits_a_live_job_again() -> None:
    with pytest.raises(LauncherError, match="c, d still queued or running but waits on a job"):
        decide({"a": COMPLETED, "b": MISSING, "c": LIVE, "d": LIVE}, CHAIN, {})


def test_decide_submits_jobs_never_submitted_and_keeps_everything_completed() -> None:
    assert decide({}, CHAIN, {}).submit == ("a", "b", "c", "d")
    assert decide(dict.fromkeys(CHAIN, COMPLETED), CHAIN, {}).submit == ()


def test_decide_keeps_a_chain_part_whose_successor_ran() -> None:
    """Training parts end in TIMEOUT by design; once the next part (afterany) ran, none is missing."""
    chosen = decide({"a": MISSING, "b": MISSING}, {"a": (), "b": ("a",)}, {}, afterany_ran=frozenset({"a"}))
    assert chosen.submit == ("b",)


def test_a_second_lock_on_the_same_run_folder_is_refused(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from launcher.relaunch import run_lock\n"
            "with run_lock(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(60)",
            str(tmp_path),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with (
            pytest.raises(
                LauncherError, match=f"another launch of {tmp_path} is running \\(pid {holder.pid} "
            ),
            run_lock(tmp_path),
        ):
            pass
    finally:
        holder.kill()  # kill -9: the kernel drops the lock with the process
        holder.wait()
    with run_lock(tmp_path):
        pass


def _locked(path: Path) -> bool:
    """Whether another process holds the launch lock (probing takes and at once drops it)."""
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@pytest.mark.slow
def test_two_launches_of_one_run_at_once_on_the_local_backend(tmp_path: Path) -> None:
    """The README's default command (the offline demo on the local backend, 40 images) started twice."""
    first = subprocess.Popen(
        [
            sys.executable,
            "launcher/main.py",
            f"cluster.shared_dir={tmp_path}",
            f"container.python={sys.executable}",
            SMALL_DEMO,
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lock = tmp_path / "results/sd_860m_res_256" / LOCK_NAME
    deadline = time.monotonic() + 60
    while not _locked(lock) and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _locked(lock), "the first launch never held the lock"
    with pytest.raises(LauncherError, match=r"another launch of .*sd_860m_res_256 is running"):
        launch(
            compose_config(
                [f"cluster.shared_dir={tmp_path}", f"container.python={sys.executable}", SMALL_DEMO]
            )
        )
    output, _ = first.communicate(timeout=300)
    assert first.returncode == 0, output
    assert (tmp_path / "data/tarfiles_reorganized/wdinfo.pkl").exists()
    records = manifest.load(tmp_path / "results/sd_860m_res_256")
    assert {r.job_id[:-2] for r in records if r.job_id} == {str(first.pid)}  # every job is the first launch's


def _dependency(slurm_cluster, job_id: str) -> str:
    shown = slurm_cluster.run_command(["scontrol", "show", "job", "-o", job_id]).stdout
    found = re.search(r"\bDependency=(\S+)", shown)
    return found.group(1) if found else ""


@pytest.mark.slow
def test_relaunch_refused_while_jobs_pend_then_resubmit_missing_waits_on_the_live_ones(
    slurm_cluster, slurm_shared: Path, drained: None
) -> None:
    ids = launch_demo(slurm_shared)
    assert set(ids) == {
        "make_demo_source",
        "download_parquet",
        "download_images",
        "reorganize_tar",
        "generate_wdinfo",
    }
    with pytest.raises(LauncherError) as refused:
        launch_demo(slurm_shared)
    message = str(refused.value)
    assert all(f"{name} (job {job_id}: PENDING)" in message for name, job_id in ids.items()), message
    assert "python -m launcher cancel" in message and "another run_name" in message
    assert {
        r.name: r.job_id for r in manifest.load(slurm_shared / "results/sd_860m_res_256")
    } == ids  # untouched
    # The last job cancelled: resubmit=missing submits it alone, waiting on the live reorganize_tar.
    slurm_cluster.run_command(["scancel", ids["generate_wdinfo"]])
    slurm_cluster.wait_job(ids["generate_wdinfo"], timeout=30)
    again = launch_demo(slurm_shared, "resubmit=missing")
    assert again["generate_wdinfo"] != ids["generate_wdinfo"]
    assert {k: v for k, v in again.items() if k != "generate_wdinfo"} == {
        k: v for k, v in ids.items() if k != "generate_wdinfo"
    }
    assert _dependency(slurm_cluster, again["generate_wdinfo"]).startswith(f"afterok:{ids['reorganize_tar']}")
    slurm_cluster.run_command(["scontrol", "update", "nodename=n1,n2", "state=resume"])
    for job_id in again.values():
        assert {j.state for j in slurm_cluster.wait_jobs(job_id, timeout=240)} == {"COMPLETED"}
    assert (slurm_shared / "data/tarfiles_reorganized/wdinfo.pkl").exists()


@pytest.mark.slow
def test_resubmit_missing_after_one_failed_array_task(slurm_cluster, slurm_shared: Path) -> None:
    # A done marker written with other options makes download_images task 1 (and only it) fail.
    raw = slurm_shared / "data/tarfiles_raw"
    raw.mkdir(parents=True)
    (raw / "part-00001.done.json").write_text('{"options": {"image_size": 1}}')
    ids = launch_demo(slurm_shared)
    tasks = sorted(j.state for j in slurm_cluster.wait_jobs(ids["download_images"], timeout=240))
    assert tasks == ["COMPLETED", "FAILED"]
    assert slurm_cluster.wait_job(ids["reorganize_tar"], timeout=60).state == "CANCELLED"
    (raw / "part-00001.done.json").unlink()
    again = launch_demo(slurm_shared, "resubmit=missing")
    for name in ("make_demo_source", "download_parquet"):
        assert again[name] == ids[name]  # completed: not submitted again
    for name in ("download_images", "reorganize_tar", "generate_wdinfo"):
        assert again[name] != ids[name]
    assert _dependency(slurm_cluster, again["download_images"]) in ("", "(null)")  # its upstream completed
    for name in ("download_images", "reorganize_tar", "generate_wdinfo"):
        assert {j.state for j in slurm_cluster.wait_jobs(again[name], timeout=240)} == {"COMPLETED"}
    logs = slurm_shared / "results/sd_860m_res_256/data_preparation/logs"
    assert len(list(logs.glob("download_parquet_*.out"))) == 1
    assert (slurm_shared / "data/tarfiles_reorganized/wdinfo.pkl").exists()


@pytest.mark.slow
def test_resubmit_missing_on_the_local_backend_runs_only_what_failed(tmp_path: Path) -> None:
    raw = tmp_path / "data/tarfiles_raw"
    raw.mkdir(parents=True)
    (raw / "part-00001.done.json").write_text('{"options": {"image_size": 1}}')  # task 1 fails
    overrides = [f"cluster.shared_dir={tmp_path}", f"container.python={sys.executable}", SMALL_DEMO]
    with pytest.raises(LauncherError, match=r"download_images: error: .*part-00001\.done\.json"):
        launch(compose_config(overrides))
    first = {r.name: r.job_id for r in manifest.load(tmp_path / "results/sd_860m_res_256")}
    (raw / "part-00001.done.json").unlink()
    launch(compose_config([*overrides, "resubmit=missing"]))
    again = {r.name: r.job_id for r in manifest.load(tmp_path / "results/sd_860m_res_256")}
    assert {n for n in again if again[n] == first[n]} == {"make_demo_source", "download_parquet"}
    logs = tmp_path / "results/sd_860m_res_256/data_preparation/logs"
    assert len(list(logs.glob("download_parquet_*.out"))) == 1
    assert len(list(logs.glob("download_images_*.out"))) == 4  # 2 tasks, twice
    assert (tmp_path / "data/tarfiles_reorganized/wdinfo.pkl").exists()
