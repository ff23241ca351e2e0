"""Data preparation end to end, offline: the demo's real images served on 127.0.0.1, real
img2dataset, real tars, through the local backend and through the real Slurm test cluster.
The output is read back the way NeMo's WebDatasetCommon reads it (wdinfo keys, local_root_path
join, .jpg/.txt members only)."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
from fixtures.data import check_demo_dataset, launch_demo_data

from launcher import manifest

pytestmark = pytest.mark.slow


def test_demo_on_the_local_backend_then_rerun_is_identical(tmp_path: Path) -> None:
    data = launch_demo_data(tmp_path, "cluster=local")
    check_demo_dataset(data)
    before = {p: p.read_bytes() for p in (data / "tarfiles_reorganized").glob("*.tar")}
    (data / "tarfiles_reorganized" / "000003.tar").unlink()  # as if a task died before writing it
    launch_demo_data(tmp_path, "cluster=local")
    after = {p: p.read_bytes() for p in (data / "tarfiles_reorganized").glob("*.tar")}
    assert before == after


def test_demo_on_the_real_slurm_cluster(slurm_cluster, slurm_shared: Path) -> None:
    # The slurm preset caches latents whatever the dataset; this is the image steps' test.
    launch_demo_data(
        slurm_shared, "cluster=slurm", "data_preparation.precache.enable=false", "container=none"
    )
    records = manifest.load(slurm_shared / "results/sd_860m_res_256")
    for record in records:
        assert record.job_id and record.backend == "slurm"
        states = {j.state for j in slurm_cluster.wait_jobs(record.job_id, timeout=240)}
        assert states == {"COMPLETED"}, (record.name, states)
    by_name = {r.name: r for r in records}
    assert by_name["download_images"].depends_on == ["afterok:download_parquet"]
    assert by_name["download_images"].array == "0-1%2"
    check_demo_dataset(slurm_shared / "data")


def test_demo_then_data_check_with_nemo_on_the_local_backend(tmp_path: Path) -> None:
    """Issue acceptance: stages=[data_preparation,data_check] passes offline and reports the real
    sample count and batch shape, read by NeMo's own loader (needs the NeMo venv)."""
    nemo = os.environ.get("NEMO_PYTHON") or str(
        Path(__file__).resolve().parent.parent / ".venv-nemo/bin/python"
    )
    if not Path(nemo).exists():
        if os.environ.get("REQUIRE_NEMO"):
            pytest.fail(f"REQUIRE_NEMO is set but there is no NeMo interpreter at {nemo}")
        pytest.skip(f"no NeMo interpreter at {nemo} (tests/install_nemo.sh)")
    # The data alone: no assets job, no model check (tests/test_training_slurm.py runs both, staged
    # from the fake Hub, and tests/test_nemo_training.py the model check).
    data = launch_demo_data(
        tmp_path,
        "cluster=local",
        "stages=[data_preparation,data_check]",
        f"data_check.python={nemo}",
        "assets.enable=false",
        "data_check.model_check=false",
    )
    report = json.loads((tmp_path / "results/sd_860m_res_256/data_check/report.json").read_text())
    with open(data / "tarfiles_reorganized/wdinfo.pkl", "rb") as handle:
        total = pickle.load(handle)["total_key_count"]
    assert report["ok"] and report["wdinfo"]["total_key_count"] == total
    assert report["loader"]["images"] == [4, 256, 256, 3]
