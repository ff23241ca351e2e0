"""Slurm's limits on a real cluster whose slurm.conf says MaxArraySize=64 (2 for the demo) and MaxJobCount=1000:
the demo with 5 partitions goes in 3 arrays and gives the same samples as with 2; status, logs, cancel and
resubmit=missing treat a split array as one job; a plan above MaxJobCount is refused before submission.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import webdataset as wds
from fixtures.data import check_demo_dataset, launch_demo_data
from slurm.cluster import SlurmCluster

from launcher import manifest, relaunch
from launcher.backends import prepare
from launcher.backends.slurm import SlurmBackend, read_limits
from launcher.errors import LauncherError
from launcher.job_states import error_lines, status
from launcher.limits import fit
from launcher.spec import Array, Dependency, JobSpec, Plan, Resources

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
# MinJobAge: finished jobs stay visible to scontrol for the length of the slow test below.
LIMITS = {"MaxArraySize": 64, "MaxJobCount": 1000, "MinJobAge": 3600}


@pytest.fixture(scope="module")
def small_cluster(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The session's cluster with small limits for this module (its other users keep Slurm's defaults)."""
    with slurm_cluster.limits(LIMITS):
        yield slurm_cluster


@pytest.fixture
def shared(small_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    for key, value in small_cluster.env.items():
        monkeypatch.setenv(key, value)
    with tempfile.TemporaryDirectory(prefix="limits-", dir="/tmp") as tmp:
        Path(tmp).chmod(0o755)
        yield Path(tmp)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "250"}
    return subprocess.run(
        [sys.executable, "-m", "launcher", *args], capture_output=True, text=True, cwd=REPO, env=env
    )


def _wait_completed(cluster: SlurmCluster, records: list[manifest.JobRecord]) -> None:
    """Every task of every job (all parts) ends COMPLETED; else the jobs' error lines."""
    for r in records:
        states = Counter(j.state for i in r.ids for j in cluster.wait_jobs(i, timeout=1200))
        assert set(states) == {"COMPLETED"}, (r.name, states, error_lines(r.log_pattern))


def _samples(data: Path) -> tuple[int, Counter[tuple[str, str]]]:
    """wdinfo's total and every training sample as (caption, sha256 of the image)."""
    root = data / "tarfiles_reorganized"
    info = pickle.loads((root / "wdinfo.pkl").read_bytes())
    found: Counter[tuple[str, str]] = Counter()
    for name in info["tar_files"]:
        for sample in wds.WebDataset(str(root / name), shardshuffle=False):
            found[(sample["txt"].decode(), hashlib.sha256(sample["jpg"]).hexdigest())] += 1
    return info["total_key_count"], found


def test_the_cluster_reports_its_limits(shared: Path) -> None:
    limits = read_limits()
    assert (limits.max_array_size, limits.max_job_count) == (64, 1000)


# The split is what is tested, not its size: MaxArraySize 2 here (the module's 64 restored after) splits
# 5 download tasks into 3 arrays (2, 2, 1) as 64 splits 150, at a thirtieth of the img2dataset starts.
SPLIT_LIMITS = {**LIMITS, "MaxArraySize": 2}


def test_demo_with_5_partitions_is_split_completes_and_matches_2_partitions(
    small_cluster: SlurmCluster, shared: Path
) -> None:
    split, whole = shared / "split", shared / "whole"
    # 124 demo rows: 24 or 25 per partition, so that no partition holds only the demo's few bad rows (a task
    # that downloads nothing fails by design), and 120 good ones, whole tars of 20 (none dropped).
    # The slurm preset caches latents whatever the dataset; the split array is the image download's.
    demo = (
        "cluster=slurm",
        "data_preparation.precache.enable=false",
        "container=none",
        "data_preparation.demo.num_images=124",
    )
    throttle = "data_preparation.download_images.array_throttle=2"
    with small_cluster.limits(SPLIT_LIMITS):  # Slurm forgets the jobs when the limits change back
        launch_demo_data(split, *demo, "data_preparation.num_partitions=5", throttle)
        launch_demo_data(whole, *demo)
        records = manifest.load(split / "results/sd_860m_res_256")
        _wait_completed(small_cluster, records)
        _wait_completed(small_cluster, manifest.load(whole / "results/sd_860m_res_256"))
        by_name = {r.name: r for r in records}
        download = by_name["download_images"]
        assert download.array == "0-4%2" and len(download.part_ids) == 3
        # One job in status: the 5 tasks of its 3 parts together.
        (download_status,) = [
            st for st in status(split / "results/sd_860m_res_256") if st.record.name == "download_images"
        ]
        assert download_status.states == Counter({"COMPLETED": 5})
        shown = _cli("status", str(split / "results/sd_860m_res_256"))
        ids = ",".join(download.part_ids)  # the job table's row: every part's id, the tasks together
        row = [
            line for line in shown.stdout.splitlines() if line.startswith("download_images") and ids in line
        ]
        assert shown.returncode == 0 and len(row) == 1 and "COMPLETED 5" in row[0], (
            shown.stdout + shown.stderr
        )
        # Every partition was downloaded once (task ids global across the parts), and the output is exact.
        markers = sorted(p.name for p in (split / "data/tarfiles_raw").glob("*.done.json"))
        assert len(markers) == 5, markers[:5]
        check_demo_dataset(split / "data")
        assert _samples(split / "data") == _samples(whole / "data")
        logs = _cli("logs", str(split / "results/sd_860m_res_256"), "download_images")
        assert logs.returncode == 0 and "download_images_" in logs.stdout, logs.stderr


def _sleepers(run_dir: Path, out: Path, seconds: int) -> Plan:
    """first -> fan (100 tasks, throttle 4: 2 parts on this cluster) -> last."""
    res = Resources(cpus_per_task=1, mem="100M", time="00:10:00")
    task = f'sleep {seconds}; touch "$0/task_$SLURM_ARRAY_TASK_ID"'
    return Plan(
        run_dir=run_dir,
        jobs=(
            JobSpec("toy", "first", ("true",), res),
            JobSpec(
                "toy",
                "fan",
                ("bash", "-c", task, str(out)),
                res,
                array=Array(100, 4),
                depends_on=(Dependency("first"),),
            ),
            JobSpec("toy", "last", ("true",), res, depends_on=(Dependency("fan"),)),
        ),
    )


def test_cancel_and_resubmit_missing_treat_the_split_array_as_one_job(
    small_cluster: SlurmCluster, shared: Path
) -> None:
    run, out = shared / "run", shared / "out"
    out.mkdir()
    limits = read_limits()
    SlurmBackend().schedule(prepare(fit(_sleepers(run, out, 300), limits)))
    first, fan = ({r.name: r for r in manifest.load(run)}[name] for name in ("first", "fan"))
    assert len(fan.part_ids) == 2
    assert small_cluster.wait_job(str(first.job_id), timeout=60).state == "COMPLETED"
    (fan_status,) = [st for st in status(run) if st.record.name == "fan"]
    assert sum(fan_status.states.values()) == 100 and fan_status.active
    # A launch while the split job is live names it once.
    with pytest.raises(LauncherError, match=r"fan \(job " + fan.part_ids[0] + ":" + fan.part_ids[1]):
        relaunch.request_for(fit(_sleepers(run, out, 0), limits), False, "slurm")
    cancelled = _cli("cancel", str(run))
    assert cancelled.returncode == 0 and all(i in cancelled.stdout for i in fan.part_ids), cancelled.stdout
    for part in fan.part_ids:
        assert {j.state for j in small_cluster.wait_jobs(part, timeout=60)} == {"CANCELLED"}
    # resubmit=missing: `first` completed and stays; the split job goes again, in parts, as one job.
    request = relaunch.request_for(fit(_sleepers(run, out, 0), limits), True, "slurm")
    assert [job.name for job, _ in request.scripts] == ["fan", "last"]
    SlurmBackend().schedule(request)
    records = manifest.load(run)
    again = {r.name: r for r in records}["fan"]
    assert len(again.part_ids) == 2 and not set(again.part_ids) & set(fan.part_ids)
    _wait_completed(small_cluster, records)
    assert sorted(int(p.name.split("_")[1]) for p in out.glob("task_*")) == list(range(100))
    assert [st.summary() for st in status(run)] == ["COMPLETED 1", "COMPLETED 100", "COMPLETED 1"]


def test_a_plan_above_max_job_count_is_refused_before_anything_is_submitted(
    small_cluster: SlurmCluster, shared: Path
) -> None:
    before = small_cluster.run_command(["squeue", "-h", "-t", "all", "-o", "%i"]).stdout
    with pytest.raises(LauncherError) as error:
        launch_demo_data(shared, "cluster=slurm", "container=none", "data_preparation.num_partitions=1000")
    assert "lower data_preparation.num_partitions to at most" in str(error.value)
    assert "MaxJobCount 1000" in str(error.value)
    assert small_cluster.run_command(["squeue", "-h", "-t", "all", "-o", "%i"]).stdout == before
    assert not (shared / "results/sd_860m_res_256/manifest.json").exists()
