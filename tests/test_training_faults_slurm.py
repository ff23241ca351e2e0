"""Faults between training parts on the real Slurm test cluster (2 nodes x 8 fake GPUs): the rendered scripts,
Slurm's chain (afterany + singleton), cancellation, --exclude, the attempts file and `status` are real.
Stand-ins: NeMo's sd_train.py is tests/standin_sd_train.py (it crashes at start when asked), nvidia-smi is
tests/standin_bin/nvidia-smi (on the node named in STANDIN_NVIDIA_SMI_FAILING_NODE its GPU 3 reports
uncorrectable ECC errors), pyxis is the SPANK stand-in that runs no container."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import REPO
from fixtures.launches import run_status
from test_training_slurm import _launch, _log, shared  # noqa: F401 (shared: the fixture)

from launcher.outputs import TrainingOutputs

pytestmark = pytest.mark.slow
RUN = "results/sd_860m_res_256"
# Room for a checkpoint: the test folder's file system need not have the default 10 GB free.
SMALL_DISK = "training.fault_tolerance.node_check.min_free_gb=0.001"


@pytest.fixture
def standin_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    """The jobs inherit this PATH (sbatch exports the submitting environment)."""
    monkeypatch.setenv("PATH", f"{REPO / 'tests' / 'standin_bin'}{os.pathsep}{os.environ['PATH']}")


def _status(shared: Path) -> str:
    done = run_status(str(shared / RUN), cwd=REPO)
    assert done.returncode == 0, done.stderr
    return " ".join(done.stdout.split())  # rich wraps long lines at the terminal's width


def _rows(shared: Path) -> list[list[str]]:
    text = TrainingOutputs(shared / RUN).attempts.read_text()
    return [line.split("\t") for line in text.splitlines()]


def test_crashes_at_start_stop_the_chain_after_k(slurm_cluster, shared: Path, standin_nvidia_smi) -> None:
    ids = _launch(
        shared,
        "training.run.chain=4",
        "training.fault_tolerance.max_attempts_without_progress=2",
        "+env.STANDIN_CRASH_AT_START=wrong path /fsx/nowhere",
        SMALL_DISK,
    )
    parts = [ids[f"sd_860m_res_256_part{k}"] for k in range(4)]
    states = [slurm_cluster.wait_job(job, timeout=120).state for job in parts]
    assert states == ["FAILED", "FAILED", "CANCELLED", "CANCELLED"], _log(
        shared, "sd_860m_res_256_part1", parts[1]
    )
    events = [(job, event) for _, job, event, _ in _rows(shared)]
    assert events == [
        ("-", "launch"),
        (parts[0], "no-progress"),
        (parts[1], "no-progress"),
        (parts[1], "stopped"),
    ]
    status = _status(shared)
    assert "attempts: 2, 0 with a new checkpoint" in status
    assert (
        f"stopped: 2 attempts without progress; cancelled: {parts[2]} {parts[3]} last error (job {parts[1]}): "
        "exit 1: RuntimeError: wrong path /fsx/nowhere (crash of the STAND-IN)"
    ) in status


def test_a_node_failing_its_check_is_left_out_of_the_next_parts(
    slurm_cluster, shared: Path, standin_nvidia_smi
) -> None:
    ids = _launch(
        shared,
        "training.trainer.num_nodes=1",
        "training.model.global_batch_size=32",
        "training.run.chain=2",
        "training.trainer.max_steps=2",
        "+env.STANDIN_NVIDIA_SMI_FAILING_NODE=n1",
        SMALL_DISK,
    )
    first, second = ids["sd_860m_res_256_part0"], ids["sd_860m_res_256_part1"]
    failed = slurm_cluster.wait_job(first, timeout=120)
    # An idle cluster gives a one-node job its first node: the failing one.
    assert (failed.state, failed.nodes) == ("FAILED", "n1"), _log(shared, "sd_860m_res_256_part0", first)
    assert "error: node check failed on n1: nvidia-smi: 3, 00000000:19:00.0, 12" in _log(
        shared, "sd_860m_res_256_part0", first
    )
    resubmitted = next(detail for _, _, event, detail in _rows(shared) if event == "resubmitted")
    again = resubmitted.split()[0]
    assert resubmitted == f"{again} without n1"
    finished = {job: slurm_cluster.wait_job(job, timeout=120) for job in (again, second)}
    assert {(info.state, info.nodes) for info in finished.values()} == {("COMPLETED", "n2")}
    excluded = slurm_cluster.run_command(["scontrol", "show", "job", second]).stdout
    assert "ExcNodeList=n1" in excluded
    checkpoints = sorted(
        p.name for p in TrainingOutputs(shared / RUN).checkpoints.glob("*.ckpt") if "-EMA" not in p.name
    )
    assert [name.split("-step=")[1].split("-")[0] for name in checkpoints] == ["1", "2"]
    status = _status(shared)
    assert f"node left out: n1 (nvidia-smi: 3, 00000000:19:00.0, 12; found by job {first})" in status
    assert f"job {first} resubmitted as {again} without n1" in status
    assert "attempts: 3, 2 with a new checkpoint" in status
