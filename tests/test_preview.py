"""A dry run changes nothing that `status`, `cancel`, `logs` and `resubmit` read: after a completed
run (local backend and the real Slurm test cluster) it writes a preview beside the run folder's files."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXED_FACTS, REPO, compose_config

from launcher import manifest
from launcher.cli import launch
from launcher.preview import PREVIEW


def _files(run: Path) -> dict[str, str]:
    """Every file of the run folder but the preview (and the lock, which only holds a pid): its digest."""
    return {
        str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run.rglob("*"))
        if p.is_file() and p.relative_to(run).parts[0] not in (PREVIEW, ".launch.lock")
    }


def _status(run: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "launcher", "status", str(run)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "100"},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _preview_changes_nothing(run: Path, overrides: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    ids = {r.name: r.job_id for r in manifest.load(run)}
    assert all(ids.values()), ids
    before = _files(run)
    for extra in ([], ["resubmit=missing"]):
        capsys.readouterr()
        launch(compose_config([*overrides, "dry_run=true", *extra]))
        printed = capsys.readouterr().out
        assert _files(run) == before, extra  # byte for byte
        if extra != ["resubmit=missing"]:  # that one has nothing to submit: no preview
            assert f"scripts written under {run / PREVIEW} (a preview" in printed
            shown = json.loads((run / PREVIEW / manifest.MANIFEST).read_text())
            assert shown["preview_of"] == str(run)
            for record in shown["jobs"]:
                assert (
                    Path(record["script"]).is_relative_to(run / PREVIEW) and Path(record["script"]).exists()
                )
    table = _status(run)
    for name in ids:
        row = next(line for line in table.splitlines() if line.startswith(name + " "))
        assert "COMPLETED" in row and "NOT_SUBMITTED" not in row, table
    capsys.readouterr()
    launch(compose_config([*overrides, "resubmit=missing"]))
    assert "nothing to submit" in capsys.readouterr().out
    assert {r.name: r.job_id for r in manifest.load(run)} == ids


def test_a_first_dry_run_writes_into_the_run_folder(tmp_path: Path) -> None:
    """Nothing launched yet: the run folder itself holds the dry run's scripts (as documented)."""
    # The slurm preset's encode step runs NeMo: the facts name a NeMo venv, whatever this checkout has.
    run = launch(
        compose_config([f"cluster.shared_dir={tmp_path}", "cluster=slurm", "dry_run=true"]), FIXED_FACTS
    )
    assert (run / "data_preparation/download_images.sbatch").exists()
    assert not (run / PREVIEW).exists()
    assert {r.backend for r in manifest.load(run)} == {"dry_run"}


def test_each_preview_is_one_dry_run_whole(tmp_path: Path) -> None:
    """A run folder whose manifest records a launch (here: its records rewritten as a local launch's)."""
    base = [f"cluster.shared_dir={tmp_path}", "cluster=slurm", "dry_run=true", "stages=[data_preparation]"]
    run = launch(compose_config([*base, "data_preparation=demo"]), FIXED_FACTS)
    launched = [
        dataclasses.replace(r, backend="local", job_id=f"9{i}") for i, r in enumerate(manifest.load(run))
    ]
    manifest.save(run, launched)
    before = _files(run)
    launch(compose_config([*base, "data_preparation=demo"]), FIXED_FACTS)
    assert (run / PREVIEW / "data_preparation/make_demo_source.sbatch").exists()
    launch(compose_config(base), FIXED_FACTS)  # no demo source: the earlier preview's script is gone
    assert not (run / PREVIEW / "data_preparation/make_demo_source.sbatch").exists()
    script = run / PREVIEW / "data_preparation/download_images.sbatch"
    assert (
        str(run / "data_preparation/logs/download_images_%A_%a.out") in script.read_text()
    )  # the run's logs
    assert _files(run) == before and manifest.load(run) == launched
    assert not [p for p in run.iterdir() if p.name.startswith(f".{PREVIEW}")]  # no staging folder left


@pytest.mark.slow
def test_a_dry_run_after_a_completed_local_run_changes_nothing(
    demo_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The session's demo_data run (the README's default command): its preview is removed after."""
    run = demo_data / "results/sd_860m_res_256"
    try:
        _preview_changes_nothing(run, [f"cluster.shared_dir={demo_data}"], capsys)
    finally:
        shutil.rmtree(run / PREVIEW, ignore_errors=True)


@pytest.mark.slow
def test_a_dry_run_after_a_completed_slurm_run_changes_nothing(
    slurm_cluster, slurm_demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The session's finished demo run on the cluster (fixtures/slurm.py): its preview is removed after."""
    run = slurm_demo / "results/sd_860m_res_256"
    for record in manifest.load(run):
        assert {j.state for j in slurm_cluster.wait_jobs(record.job_id, timeout=240)} == {"COMPLETED"}
    overrides = [
        f"cluster.shared_dir={slurm_demo}",
        "data_preparation=demo",
        "cluster=slurm",
        # The slurm preset caches latents whatever the dataset; launch_demo's runs are the image steps.
        "data_preparation.precache.enable=false",
        "container=none",
        f"container.python={sys.executable}",
    ]
    try:
        _preview_changes_nothing(run, overrides, capsys)
    finally:
        shutil.rmtree(run / PREVIEW, ignore_errors=True)
