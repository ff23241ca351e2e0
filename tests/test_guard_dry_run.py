"""What a dry run writes, and `status` on what it planned.

A dry run writes the run folder's scripts, extra files, config.yaml, manifest.json and launch lock
(launcher.preview), creating the folders they need but never a top-level one: the README's aws_p5 dry
run on a host without /fsx writes nothing at all. `status` counts an unsubmitted array's tasks.
"""

from __future__ import annotations

import shlex
import shutil
import uuid
from pathlib import Path

import pytest
from conftest import REPO, compose_config
from fixtures.launches import readme_commands, run_status

from launcher import manifest
from launcher.cli import host_facts, main
from launcher.job_states import status
from launcher.pipeline import build_plan
from launcher.validate import to_schema


def _everything(folder: Path) -> set[Path]:
    return set(folder.rglob("*"))


def test_the_readme_aws_p5_dry_run_creates_nothing_on_a_host_without_fsx(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's command as printed (its base_results_dir /fsx/results), from an empty folder."""
    if Path("/fsx").exists():
        pytest.skip("this host has /fsx: the command would write its run folder there, as documented")
    [launch] = [line for line in readme_commands() if "dry_run=true" in line]
    monkeypatch.chdir(tmp_path)
    assert main(shlex.split(launch)[2:]) == 0
    out = capsys.readouterr().out
    assert not Path("/fsx").exists() and _everything(tmp_path) == set()
    assert "#!/bin/bash" in out and "nothing written: /fsx is not on this host" in out
    assert "run folder would be /fsx/results/sd_860m_res_256" in " ".join(out.split())


def test_a_dry_run_creates_no_top_level_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same on any host: a shared_dir under a top-level folder that is not there (the cluster's file
    system) is never made; one under a folder that is there is, as a real launch would."""
    monkeypatch.chdir(tmp_path)
    top = Path(f"/sd-launcher-test-{uuid.uuid4().hex}")

    def dry_run(shared: Path) -> int:
        mounts = f"container.mounts=[{shared}:{shared}]"
        argv = ["cluster=slurm", "container=pyxis", f"cluster.shared_dir={shared}", mounts]
        return main([*argv, "stages=[data_preparation,training]", "dry_run=true"])

    try:
        assert dry_run(top / "sd") == 0
        assert not top.exists() and _everything(tmp_path) == set()
    finally:
        if top.exists():
            shutil.rmtree(top)
    assert dry_run(tmp_path / "not/yet") == 0  # on the cluster: /shared is there, /shared/sd not yet
    assert (tmp_path / "not/yet/results/sd_860m_res_256/manifest.json").is_file()


def test_a_dry_run_writes_only_its_run_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the cluster (shared_dir there): the run folder holds the scripts, the plan's files, config.yaml,
    manifest.json and the launch lock (and each stage's empty log folder, for a script run by hand); the
    data folder and everything else stay untouched."""
    shared, cwd = tmp_path / "shared", tmp_path / "cwd"
    shared.mkdir()
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    argv = [
        "cluster=slurm",
        "container=pyxis",
        f"cluster.shared_dir={shared}",
        f"container.mounts=[{shared}:{shared}]",
        "stages=[data_preparation,training]",
        "dry_run=true",
    ]
    assert main(argv) == 0
    run = shared / "results/sd_860m_res_256"
    records = manifest.load(run)
    plan = build_plan(to_schema(compose_config(argv)), host_facts())
    files = {Path(r.script) for r in records} | {path for path, _ in plan.files}
    files |= {run / "config.yaml", run / "manifest.json", run / ".launch.lock"}
    logs = {Path(r.log_pattern).parent for r in records}
    folders = {p for f in files | logs for p in f.parents if p.is_relative_to(run)} | {shared / "results"}
    assert _everything(tmp_path) == files | logs | folders | {shared, cwd}
    assert all(not any(log.iterdir()) for log in logs) and len(records) >= 6


def test_status_counts_every_task_of_an_array_not_submitted(tmp_path: Path) -> None:
    """A dry run's (or a failed submission's) array shows all its tasks NOT_SUBMITTED, as `status` counts
    a submitted one's tasks; an array the cluster takes in parts counts once, whole."""
    argv = [
        "cluster=slurm",
        "container=pyxis",
        f"cluster.shared_dir={tmp_path}",
        f"container.mounts=[{tmp_path}:{tmp_path}]",
        "cluster.max_array_size=100",  # download_images' 128 tasks go in two parts
        "cluster.max_job_count=10000",
        "dry_run=true",
    ]
    assert main(argv) == 0
    cfg = to_schema(compose_config(argv))
    run = tmp_path / "results/sd_860m_res_256"
    counted = {st.record.name: st.states for st in status(run)}
    partitions = cfg.data_preparation.num_partitions
    assert partitions == 128
    assert counted["download_images"] == {"NOT_SUBMITTED": partitions}
    assert counted["download_parquet"] == {"NOT_SUBMITTED": 1}
    reorganize = next(r for r in manifest.load(run) if r.name == "reorganize_tar")
    assert reorganize.array and counted["reorganize_tar"] == {
        "NOT_SUBMITTED": int(reorganize.array.split("-")[1]) + 1
    }
    done = run_status(str(run), cwd=REPO)
    row = next(line for line in done.stdout.splitlines() if line.startswith("download_images"))
    assert "NOT_SUBMITTED 128" in row, done.stdout
