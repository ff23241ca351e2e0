"""The Slurm backend against a real Slurm cluster (tests/slurm): arrays, throttling, afterok chains,
failure cancelling dependents, sbatch errors, status/logs/cancel from the manifest.

Pyxis cannot run here: jobs with container flags run under the SPANK stand-in that accepts
pyxis's options and runs NO container (tests/slurm/spank_pyxis_standin_no_container.c).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from toy_pipeline import max_concurrency, toy_plan

from launcher import manifest
from launcher.backends import prepare
from launcher.backends.slurm import SlurmBackend
from launcher.errors import SubmitError
from launcher.job_states import status
from launcher.spec import Container, JobSpec, Plan, Resources

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def cluster_env(slurm_cluster, monkeypatch: pytest.MonkeyPatch):
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    return slurm_cluster


@pytest.fixture
def work() -> Iterator[Path]:
    # Under /tmp itself, readable by the Slurm daemons.
    with tempfile.TemporaryDirectory(prefix="launcher-test-", dir="/tmp") as tmp:
        (Path(tmp) / "out").mkdir()
        yield Path(tmp)


def _wait_all(cluster, ids: dict[str, str]) -> dict[str, list[str]]:
    return {name: [j.state for j in cluster.wait_jobs(job_id, timeout=90)] for name, job_id in ids.items()}


def test_pipeline_arrays_throttle_and_afterok(cluster_env, work: Path) -> None:
    plan = toy_plan(work / "run", work / "out", throttle=2)
    ids = SlurmBackend().schedule(prepare(plan))
    states = _wait_all(cluster_env, ids)
    assert states == {"first": ["COMPLETED"], "fan": ["COMPLETED"] * 4, "last": ["COMPLETED"]}
    assert (work / "out/last.txt").read_text().strip() == "4"
    assert max_concurrency(work / "out") == 2
    summary = {s.record.name: s.summary() for s in status(work / "run")}
    assert summary == {"first": "COMPLETED 1", "fan": "COMPLETED 4", "last": "COMPLETED 1"}
    log = work / "run/toy/logs" / f"fan_{ids['fan']}_3.out"
    assert "task 3/4 on n" in log.read_text()
    logs = subprocess.run(
        [sys.executable, "-m", "launcher", "logs", str(work / "run"), "first"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    )
    assert "first_" in logs.stdout


def test_failed_array_task_cancels_dependents(cluster_env, work: Path) -> None:
    plan = toy_plan(work / "run", work / "out", fail_task=2)
    ids = SlurmBackend().schedule(prepare(plan))
    fan = cluster_env.wait_jobs(ids["fan"], timeout=90)
    assert sorted(j.state for j in fan) == ["COMPLETED"] * 3 + ["FAILED"]
    assert cluster_env.wait_job(ids["last"], timeout=30).state == "CANCELLED"
    assert not (work / "out/last.txt").exists()
    st = {s.record.name: s for s in status(work / "run")}
    assert st["fan"].states["FAILED"] == 1 and st["fan"].exit_codes["3:0"] == 1


def test_sbatch_error_is_reported_and_nothing_after_is_submitted(cluster_env, work: Path) -> None:
    plan = toy_plan(work / "run", work / "out")
    bad = dataclasses.replace(
        plan.jobs[1], resources=dataclasses.replace(plan.jobs[1].resources, partition="no_such_partition")
    )
    plan = dataclasses.replace(plan, jobs=(plan.jobs[0], bad, plan.jobs[2]))
    with pytest.raises(SubmitError, match="invalid partition specified"):
        SlurmBackend().schedule(prepare(plan))
    records = {r.name: r.job_id for r in manifest.load(work / "run")}
    assert records["first"] and records["fan"] is None and records["last"] is None


def test_cancel_a_run(cluster_env, work: Path) -> None:
    sleeper = JobSpec(
        stage="toy", name="sleeper", argv=("sleep", "300"), resources=Resources(mem="100M", time="00:10:00")
    )
    ids = SlurmBackend().schedule(prepare(Plan(run_dir=work / "run", jobs=(sleeper,))))
    done = subprocess.run(
        [sys.executable, "-m", "launcher", "cancel", str(work / "run")],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert cluster_env.wait_job(ids["sleeper"], timeout=30).state == "CANCELLED"


def test_pyxis_flags_reach_the_standin_on_two_nodes(cluster_env, work: Path) -> None:
    """16 ranks on 2 nodes with the exact pyxis flags users get (the stand-in runs no container)."""
    job = JobSpec(
        stage="toy",
        name="ranks",
        argv=(
            "bash",
            "-c",
            'echo "rank=$SLURM_PROCID node=$SLURM_NODEID '
            "image=$PYXIS_STANDIN_CONTAINER_IMAGE env=$PYXIS_STANDIN_CONTAINER_ENV "
            'gpus=$CUDA_VISIBLE_DEVICES" > "$0/rank_$SLURM_PROCID"',
            str(work / "out"),
        ),
        resources=Resources(nodes=2, ntasks_per_node=8, gpus_per_node=8, mem="1G", time="00:05:00"),
        container=Container(
            image="/fsx/apps/nemo sd.sqsh", mounts=("/fsx:/fsx",), env_names=("FI_PROVIDER",)
        ),
        env=(("FI_PROVIDER", "efa"),),
    )
    ids = SlurmBackend().schedule(prepare(Plan(run_dir=work / "run", jobs=(job,))))
    assert cluster_env.wait_job(ids["ranks"], timeout=60).state == "COMPLETED"
    lines = sorted((work / "out").glob("rank_*"))
    assert len(lines) == 16
    rank0 = (work / "out/rank_0").read_text()
    assert "image=/fsx/apps/nemo sd.sqsh env=FI_PROVIDER" in rank0
    assert {p.read_text().split()[1] for p in lines} == {"node=0", "node=1"}
