"""Session-scoped pytest fixture `slurm_cluster`: one real Slurm cluster (tests/slurm/cluster.py) per run.

Skipped, with the reason, when this machine cannot run it (not root, or packages missing: run
tests/slurm/install.sh). With REQUIRE_SLURM=1 (CI sets it) that is a failure instead of a skip,
so CI can never pass by silently skipping every Slurm test.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm.cluster import SlurmCluster, missing_requirements


def unavailable_reason() -> str | None:
    """Why the cluster cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "the Slurm test cluster needs root (it starts munged, slurmctld and slurmd)"
    missing = missing_requirements()
    if missing:
        return f"Slurm test cluster missing {', '.join(missing)}; run tests/slurm/install.sh as root"
    return None


def slurm_required() -> bool:
    return os.environ.get("REQUIRE_SLURM", "") not in ("", "0")


def running_cluster(extra_conf: dict[str, object] | None = None) -> Iterator[SlurmCluster]:
    """For a fixture: a cluster brought up (with `extra_conf` slurm.conf settings), then torn down;
    skipped, or failed under REQUIRE_SLURM, where this machine cannot run one."""
    reason = unavailable_reason()
    if reason is not None:
        if slurm_required():
            pytest.fail(f"REQUIRE_SLURM is set but {reason}", pytrace=False)
        pytest.skip(reason)
    cluster = SlurmCluster.in_new_tmp_dir(extra_conf)
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down()


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A running two-node cluster (n1, n2; 16 CPUs, 8 fake GPUs each); pass `.env` to subprocesses."""
    yield from running_cluster()


@pytest.fixture
def slurm_shared(slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder the cluster's jobs can use (user munge and the job users traverse /tmp, not pytest's
    0700 tmp dirs), with the cluster's environment set for the launcher under test."""
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    with tempfile.TemporaryDirectory(prefix="dataprep-", dir="/tmp") as tmp:
        os.chmod(tmp, 0o755)
        yield Path(tmp)
