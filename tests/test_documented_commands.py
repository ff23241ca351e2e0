"""Commands taken from the docs, so that the docs cannot rot: docs/generic-slurm.md's command composes,
passes every check and dry-runs with the page's partition, image, mounts and shared_dir in the scripts;
the README's cluster commands work as printed."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from fixtures.docs import GENERIC_SLURM, generic_slurm_commands
from fixtures.launches import readme_commands

from launcher import manifest
from launcher.cli import main

DOC = GENERIC_SLURM


def documented_command() -> list[str]:
    """The page's pyxis launch command (its other one is cluster=slurm alone)."""
    [words] = [words for words in generic_slurm_commands() if "container=pyxis" in words]
    return words


def test_the_documented_generic_slurm_command_dry_runs(tmp_path: Path) -> None:
    words = documented_command()
    assert words[:2] == [".venv/bin/python", "launcher/main.py"] and "dry_run=true" in words, words
    # The page's shared file system is /shared: here, tmp_path with the image from its step 2.
    argv = [word.replace("/shared", str(tmp_path)) for word in words[2:]]
    (tmp_path / "apps").mkdir()
    (tmp_path / "apps/nemo-sd.sqsh").write_bytes(b"hsqs")
    assert main(argv) == 0
    run = tmp_path / "sd/results/sd_860m_res_256"
    scripts = {r.name: Path(r.script).read_text() for r in manifest.load(run)}
    training = scripts["sd_860m_res_256"]
    assert "#SBATCH --partition=gpu" in training and "#SBATCH --account=my-team" in training
    assert "#SBATCH --nodes=2" in training and "#SBATCH --time=12:00:00" in training
    assert f"--container-image={tmp_path}/apps/nemo-sd.sqsh" in training
    assert f"--container-mounts={tmp_path}:{tmp_path}" in training
    assert "#SBATCH --partition=cpu" in scripts["download_parquet"]
    assert f"{tmp_path}/sd/data" in scripts["download_parquet"]


def test_the_image_is_checked_before_anything_is_written_for_every_plan(
    tmp_path: Path, recording_sbatch: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The page's `container.image` row: "checked on the login node before anything is written, for
    every plan". Its command, submitted for data preparation alone, without the image: one line, nothing
    written, nothing submitted."""
    assert "checked on the login node before anything is written, for every plan" in DOC.read_text()
    argv = [word.replace("/shared", str(tmp_path)) for word in documented_command()[2:]]
    argv = [word for word in argv if word != "dry_run=true"] + ["stages=[data_preparation]"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: container.image: {tmp_path}/apps/nemo-sd.sqsh does not exist on this host; build it with "
        "enroot/import.sh or fix the path\n"
    )
    assert list(tmp_path.iterdir()) == [] and not recording_sbatch.exists()


def test_every_key_in_the_table_is_in_the_command() -> None:
    """The table explains the command's keys: each row's key and value are the command's."""
    given = dict(word.split("=", 1) for word in documented_command()[2:] if "=" in word)
    rows = re.findall(r"^\| `([\w.]+)(?:=(\w+))?` \| (?:`([^`]*)`)? \|", DOC.read_text(), re.MULTILINE)
    assert len(rows) >= 10
    for key, group, value in rows:
        assert given.get(key) == (group or value), (key, given.get(key))


def test_the_readme_cluster_commands_work_as_printed_from_the_checkout(tmp_path: Path) -> None:
    """The launch line dry-runs (with /fsx on tmp_path and the image it needs), then each watch line
    runs from the checkout in a fresh shell (the venv's python here is the one running the tests)."""
    launch, status, logs, cancel = readme_commands()
    assert launch.startswith(".venv/bin/python launcher/main.py ") and launch.endswith(" dry_run=true")
    (tmp_path / "nemo.sqsh").write_bytes(b"hsqs")
    paths = [
        f"cluster.shared_dir={tmp_path}",
        f"container.mounts=[{tmp_path}:{tmp_path}]",
        f"container.image={tmp_path}/nemo.sqsh",
    ]
    assert main(shlex.split(launch)[2:] + paths) == 0

    def run(line: str) -> subprocess.CompletedProcess[str]:
        line = line.replace(".venv/bin/python", shlex.quote(sys.executable)).replace("/fsx", str(tmp_path))
        fresh = ["env", "-i", "PATH=/usr/bin:/bin", "bash", "-c", line]
        return subprocess.run(fresh, cwd=REPO, capture_output=True, text=True, timeout=120)

    done = run(status)
    assert done.returncode == 0 and "NOT_SUBMITTED" in done.stdout, done.stderr
    done = run(logs)  # a dry run has no logs yet: the command runs and says so
    assert done.returncode == 1 and "no log yet for download_images" in done.stderr, done.stderr
    done = run(cancel)
    assert done.returncode == 0 and "nothing to cancel" in done.stdout, done.stderr
