"""Data preparation end to end, offline: the demo's real images served on 127.0.0.1, real
img2dataset, real tars, through the local backend and through the real Slurm test cluster.
The output is read back the way NeMo's WebDatasetCommon reads it (wdinfo keys, local_root_path
join, .jpg/.txt members only)."""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from pathlib import Path

import pytest
from fixtures.data import check_demo_dataset, launch_demo_data

from launcher import manifest

pytestmark = pytest.mark.slow


def test_demo_on_the_local_backend_then_rerun_is_identical(new_shared: Callable[..., Path]) -> None:
    """The session's demo data (the README's default command on the local backend), copied; a launch on
    it finds everything done, then remakes one tar lost as if its task had died before writing it."""
    shared = new_shared("data")
    data = launch_demo_data(shared, "cluster=local")
    check_demo_dataset(data)
    before = {p: p.read_bytes() for p in (data / "tarfiles_reorganized").glob("*.tar")}
    (data / "tarfiles_reorganized" / "000003.tar").unlink()
    launch_demo_data(shared, "cluster=local")
    after = {p: p.read_bytes() for p in (data / "tarfiles_reorganized").glob("*.tar")}
    assert before == after


def test_demo_on_the_real_slurm_cluster(slurm_cluster, slurm_demo: Path) -> None:
    """The session's finished demo run on the cluster (fixtures/slurm.py launch_demo: the image steps; the
    slurm preset would cache latents too)."""
    records = manifest.load(slurm_demo / "results/sd_860m_res_256")
    for record in records:
        assert record.job_id and record.backend == "slurm"
        states = {j.state for j in slurm_cluster.wait_jobs(record.job_id, timeout=240)}
        assert states == {"COMPLETED"}, (record.name, states)
    by_name = {r.name: r for r in records}
    assert by_name["download_images"].depends_on == ["afterok:download_parquet"]
    assert by_name["download_images"].array == "0-1%2"
    check_demo_dataset(slurm_demo / "data")


def test_demo_then_data_check_with_nemo_on_the_local_backend(
    nemo_python: str, new_shared: Callable[..., Path]
) -> None:
    """Issue acceptance: stages=[data_preparation,data_check] passes offline and reports the real
    sample count and batch shape, read by NeMo's own loader. The session's demo data (made by the same
    data preparation) is copied in first, so the data steps find their work done and NeMo reads it."""
    shared = new_shared("data")
    # The data alone: no assets job, no model check (tests/test_training_slurm.py runs both, staged
    # from the fake Hub, and tests/test_nemo_training.py the model check).
    data = launch_demo_data(
        shared,
        "cluster=local",
        "stages=[data_preparation,data_check]",
        f"data_check.python={nemo_python}",
        "assets.enable=false",
        "data_check.model_check=false",
    )
    report = json.loads((shared / "results/sd_860m_res_256/data_check/report.json").read_text())
    with open(data / "tarfiles_reorganized/wdinfo.pkl", "rb") as handle:
        total = pickle.load(handle)["total_key_count"]
    assert report["ok"] and report["wdinfo"]["total_key_count"] == total
    assert report["loader"]["images"] == [4, 256, 256, 3]
