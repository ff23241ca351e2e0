"""Smoke tests of the real Slurm test cluster and its SPANK stand-in for pyxis (tests/slurm/)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from slurm.cluster import SlurmCluster
from slurm.config import NODES

pytestmark = pytest.mark.slow

CLUSTER_CLI = Path(__file__).resolve().parent / "slurm" / "cluster.py"


def parse_env(text: str) -> dict[str, str]:
    """`env` output as a dict (values here hold no newlines)."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def test_two_node_gpu_job_gets_standin_container_values(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    script = (
        "#!/bin/bash\n"
        "srun -o rank-%t.env --container-image=/x/y.sqsh --container-mounts=/a:/a"
        " --no-container-mount-home env\n"
        "srun -N1 -n1 -o plain.env env\n"
    )
    job_id = slurm_cluster.sbatch(
        script,
        "-N2",
        "--ntasks-per-node=8",
        "--gpus-per-node=8",
        "-o",
        "job.out",
        "-e",
        "job.err",
        cwd=tmp_path,
    )
    job = slurm_cluster.wait_job(job_id, timeout=60)
    assert (job.state, job.exit_code) == ("COMPLETED", 0), (tmp_path / "job.err").read_text()

    ranks = [parse_env((tmp_path / f"rank-{rank}.env").read_text()) for rank in range(16)]
    assert sorted(int(env["SLURM_PROCID"]) for env in ranks) == list(range(16))
    for node in NODES:
        assert sum(env["SLURMD_NODENAME"] == node for env in ranks) == 8
    for env in ranks:
        assert len(set(env["CUDA_VISIBLE_DEVICES"].split(","))) == 8
        assert env["PYXIS_STANDIN_CONTAINER_IMAGE"] == "/x/y.sqsh"
        assert env["PYXIS_STANDIN_CONTAINER_MOUNTS"] == "/a:/a"
        assert env["PYXIS_STANDIN_CONTAINER_MOUNT_HOME"] == "0"
        assert "PYXIS_STANDIN_CONTAINER_WORKDIR" not in env
    assert not any(
        key.startswith("PYXIS_STANDIN_") for key in parse_env((tmp_path / "plain.env").read_text())
    )
    assert "NO container is run" in (tmp_path / "job.err").read_text()


def test_standin_flag_pairs_last_one_wins(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    result = slurm_cluster.run_command(
        [
            "srun",
            "-n1",
            "--container-name=nemo:exec",
            "--container-writable",
            "--container-readonly",
            "--container-remap-root",
            "--container-env=NCCL_DEBUG,FI_PROVIDER",
            "env",
        ],
        cwd=tmp_path,
    )
    env = parse_env(result.stdout)
    assert env["PYXIS_STANDIN_CONTAINER_NAME"] == "nemo:exec"
    assert env["PYXIS_STANDIN_CONTAINER_WRITABLE"] == "0"
    assert env["PYXIS_STANDIN_CONTAINER_REMAP_ROOT"] == "1"
    assert env["PYXIS_STANDIN_CONTAINER_ENV"] == "NCCL_DEBUG,FI_PROVIDER"


def test_option_pyxis_lacks_is_still_rejected(slurm_cluster: SlurmCluster) -> None:
    result = slurm_cluster.run_command(["srun", "-n1", "--container-bogus=1", "true"], check=False)
    assert result.returncode != 0
    assert "unrecognized option" in result.stderr


def test_array_throttle_runs_every_task_at_most_two_at_once(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    script = (
        "#!/bin/bash\n"
        "start=$(date +%s.%N); sleep 0.5\n"
        'echo "$SLURM_ARRAY_TASK_ID $start $(date +%s.%N)" > "task-$SLURM_ARRAY_TASK_ID.times"\n'
    )
    job_id = slurm_cluster.sbatch(script, "--array=0-5%2", "-n1", "-o", "/dev/null", cwd=tmp_path)
    jobs = slurm_cluster.wait_jobs(job_id, timeout=60)
    assert sorted(job.job_id for job in jobs) == [f"{job_id}_{task}" for task in range(6)]
    assert {(job.state, job.exit_code) for job in jobs} == {("COMPLETED", 0)}

    spans = [tuple(map(float, path.read_text().split()[1:])) for path in tmp_path.glob("task-*.times")]
    assert len(spans) == 6
    running_at_each_start = [sum(start <= s < end for start, end in spans) for s, _ in spans]
    assert max(running_at_each_start) == 2


def test_afterok_child_runs_after_parent(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    parent = slurm_cluster.sbatch(
        "#!/bin/bash\nsleep 0.3; echo done > parent.txt\n", "-o", "/dev/null", cwd=tmp_path
    )
    child = slurm_cluster.sbatch(
        "#!/bin/bash\ncp parent.txt child.txt\n",
        f"--dependency=afterok:{parent}",
        "-o",
        "/dev/null",
        cwd=tmp_path,
    )
    assert slurm_cluster.wait_job(child).state == "COMPLETED"
    assert (tmp_path / "child.txt").read_text() == "done\n"


def test_failed_parent_cancels_child_with_kill_on_invalid_dep(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    parent = slurm_cluster.sbatch("#!/bin/bash\nexit 3\n", "-o", "/dev/null", cwd=tmp_path)
    child = slurm_cluster.sbatch(
        "#!/bin/bash\ntouch child-ran\n",
        f"--dependency=afterok:{parent}",
        "--kill-on-invalid-dep=yes",
        "-o",
        "/dev/null",
        cwd=tmp_path,
    )
    failed = slurm_cluster.wait_job(parent)
    assert (failed.state, failed.exit_code) == ("FAILED", 3)
    assert slurm_cluster.wait_job(child, timeout=30).state == "CANCELLED"
    assert not (tmp_path / "child-ran").exists()


def test_failed_parent_strands_child_without_kill_on_invalid_dep(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    # As on real clusters without DependencyParameters=kill_invalid_depend: launchers must pass the flag.
    parent = slurm_cluster.sbatch("#!/bin/bash\nexit 1\n", "-o", "/dev/null", cwd=tmp_path)
    child = slurm_cluster.sbatch(
        "#!/bin/bash\ntrue\n", f"--dependency=afterok:{parent}", "-o", "/dev/null", cwd=tmp_path
    )
    assert slurm_cluster.wait_job(parent).state == "FAILED"
    deadline = time.monotonic() + 30
    try:
        while (job := slurm_cluster.jobs(child)[0]).reason != "DependencyNeverSatisfied":
            assert time.monotonic() < deadline, job
            time.sleep(0.1)
        assert job.state == "PENDING"
    finally:
        slurm_cluster.run_command(["scancel", child])


def test_cli_brings_a_second_cluster_up_and_down(slurm_cluster: SlurmCluster) -> None:
    state_dir = Path(tempfile.mkdtemp(prefix="slurm-cli-", dir="/tmp"))
    up = subprocess.run(
        [sys.executable, str(CLUSTER_CLI), "up", "--state-dir", str(state_dir)],
        capture_output=True,
        text=True,
        check=False,
    )
    second = SlurmCluster(state_dir)
    try:
        assert up.returncode == 0, up.stderr
        assert up.stdout.strip() == f"export SLURM_CONF={second.conf}"
        assert second.conf.read_text() != slurm_cluster.conf.read_text()
        job = second.wait_job(second.sbatch("#!/bin/bash\nexit 7\n", "-o", "/dev/null", cwd=state_dir))
        assert (job.state, job.exit_code) == ("FAILED", 7)
        pids = [int(path.read_text().split()[0]) for path in state_dir.glob("**/*.pid")]
    finally:
        down = subprocess.run(
            [sys.executable, str(CLUSTER_CLI), "down", "--state-dir", str(state_dir)],
            capture_output=True,
            text=True,
            check=False,
        )
    assert down.returncode == 0, down.stderr
    assert len(pids) == 4
    assert not state_dir.exists()
    for pid in pids:
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().rpartition(")")[2].split()[0] == "Z"
    assert slurm_cluster.run_command(["sinfo", "-h", "-o", "%t"]).stdout.strip() == "idle"


def _config_value(cluster: SlurmCluster, key: str) -> str:
    shown = cluster.run_command(["scontrol", "show", "config"]).stdout
    return next(line.split("=", 1)[1].strip() for line in shown.splitlines() if line.startswith(f"{key} "))


def test_limits_apply_in_place_and_are_restored(slurm_cluster: SlurmCluster) -> None:
    """The session's one cluster serves the tests that need other limits (tests/fixtures/slurm.py)."""
    before = {key: _config_value(slurm_cluster, key) for key in ("MaxArraySize", "MaxJobCount")}
    with slurm_cluster.limits({"MaxArraySize": 7, "MaxJobCount": 50}):
        assert (
            _config_value(slurm_cluster, "MaxArraySize"),
            _config_value(slurm_cluster, "MaxJobCount"),
        ) == (
            "7",
            "50",
        )
        refused = slurm_cluster.run_command(["sbatch", "--array=0-7", "--wrap=true"], check=False)
        assert refused.returncode != 0 and "array" in refused.stderr.lower()
        job = slurm_cluster.sbatch("#!/bin/sh\ntrue\n", "--array=0-6", "-o", "/dev/null")
        assert {j.state for j in slurm_cluster.wait_jobs(job, timeout=60)} == {"COMPLETED"}
    assert {key: _config_value(slurm_cluster, key) for key in before} == before
    job = slurm_cluster.sbatch("#!/bin/sh\ntrue\n", "--array=0-7", "-o", "/dev/null")
    assert {j.state for j in slurm_cluster.wait_jobs(job, timeout=60)} == {"COMPLETED"}
