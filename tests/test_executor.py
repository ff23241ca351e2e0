"""The submitit executor runs a Python function on the real Slurm test cluster with the same pyxis
flags and environment as the rendered scripts (the SPANK stand-in runs NO container)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

from launcher.executor import make_executor

pytestmark = pytest.mark.slow


KEYS = (
    "PYXIS_STANDIN_CONTAINER_IMAGE",
    "PYXIS_STANDIN_CONTAINER_MOUNTS",
    "PYXIS_STANDIN_CONTAINER_ENV",
    "FI_PROVIDER",
    "NCCL_SOCKET_IFNAME",
)


def test_function_runs_with_the_presets_pyxis_flags_and_env(slurm_cluster, monkeypatch) -> None:
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    with tempfile.TemporaryDirectory(prefix="submitit-", dir="/tmp") as tmp:
        ex = make_executor(
            Path(tmp) / "jobs",
            "cluster=aws_p5",
            f"cluster.shared_dir={tmp}",
            f"container.mounts=[{tmp}:{tmp}]",
            f"container.python={sys.executable}",
            timeout_min=5,
            mem="500M",
        )
        script = ex._make_submission_file_text("CMD", "UID")  # what users would read
        assert "--container-image=/fsx/apps/nemo-sd.sqsh" in script
        # os.getenv pickles by reference: the value is read inside the job, not here.
        jobs = ex.map_array(os.getenv, KEYS)
        seen = dict(zip(KEYS, (job.result() for job in jobs), strict=True))
    assert seen["PYXIS_STANDIN_CONTAINER_IMAGE"] == "/fsx/apps/nemo-sd.sqsh"
    assert seen["PYXIS_STANDIN_CONTAINER_MOUNTS"] == f"{tmp}:{tmp}"
    assert "FI_PROVIDER" in seen["PYXIS_STANDIN_CONTAINER_ENV"].split(",")
    assert seen["FI_PROVIDER"] == "efa" and seen["NCCL_SOCKET_IFNAME"] == "^docker,lo,veth"
