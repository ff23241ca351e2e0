"""One contract for watching a run, over both backends (local, and the real Slurm test cluster): a running
job shows RUNNING with its start in `status`, `cancel` stops it (the local backend: its process group)
and `status` then says CANCELLED, and `logs --follow` on the ended job returns at once."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import REPO
from fixtures.run_shared import shared_folder
from toy_pipeline import sleeper_plan

from launcher import local_jobs, manifest
from launcher.backends import prepare
from launcher.backends.slurm import SlurmBackend
from launcher.job_states import JobStatus, status
from launcher.paths import RunPaths
from launcher.status.cli import main

LOCAL_LAUNCHER = """
import sys
sys.path.insert(0, sys.argv[2])
from pathlib import Path
from toy_pipeline import sleeper_plan
from launcher.backends import prepare
from launcher.backends.local import LocalBackend
LocalBackend(parallelism=2).schedule(prepare(sleeper_plan(Path(sys.argv[1]))))
"""


def wait_for(
    run: Path, ok: Callable[[dict[str, JobStatus]], bool], timeout: float = 30
) -> dict[str, JobStatus]:
    deadline = time.monotonic() + timeout
    while True:
        launched = (run / manifest.MANIFEST).exists()
        found = {st.record.name: st for st in status(run)} if launched else {}
        if ok(found):
            return found
        assert time.monotonic() < deadline, {name: st.summary() for name, st in found.items()}
        time.sleep(0.2)


def rows(out: str) -> dict[str, str]:
    """`status`'s job lines by job name."""
    return {line.split()[0]: line for line in out.splitlines() if line.startswith(("sleeper", "after"))}


@pytest.fixture(params=["local", "slurm"])
def running(request: pytest.FixtureRequest) -> Iterator[tuple[Path, subprocess.Popen[str] | None]]:
    """A run of sleeper_plan launched on the backend: its folder, and the local launcher's process."""
    if request.param == "slurm":
        run = request.getfixturevalue("slurm_shared") / "run"
        SlurmBackend().schedule(prepare(sleeper_plan(run)))
        yield run, None
        main(["cancel", str(run)])  # whatever the test left
        return
    folder = shared_folder("watch-local-")
    run = folder / "run"
    launcher = subprocess.Popen(
        [sys.executable, "-c", LOCAL_LAUNCHER, str(run), str(REPO / "tests")],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield run, launcher
    finally:
        if (run / manifest.MANIFEST).exists():
            main(["cancel", str(run)])
        launcher.kill()
        launcher.wait()
        shutil.rmtree(folder, ignore_errors=True)


def test_a_running_job_shows_running_then_cancel_stops_it(
    running: tuple[Path, subprocess.Popen[str] | None], capsys: pytest.CaptureFixture[str]
) -> None:
    run, launcher = running
    wait_for(run, lambda found: found.get("sleeper") is not None and "RUNNING" in found["sleeper"].states)
    # RUNNING is the job's process started; on a loaded machine its first line may come later (CI saw it
    # cancelled before it printed): the log is read below, so wait for that line here.
    deadline = time.monotonic() + 30
    while not any("started" in log.read_text() for log in (run / "toy" / "logs").glob("sleeper_*.out")):
        assert time.monotonic() < deadline, "the sleeper printed nothing in 30 s"
        time.sleep(0.1)
    assert main(["status", str(run)]) == 0
    shown = rows(capsys.readouterr().out)
    assert "RUNNING 1 since " + time.strftime("%m-%d") in shown["sleeper"], shown
    assert "PENDING 1" in shown["after"], shown

    assert main(["cancel", str(run)]) == 0
    said = capsys.readouterr().out
    assert said.startswith("cancelled sleeper, after" if launcher else "scancel "), said
    wait_for(run, lambda found: not any(st.active for st in found.values()), timeout=15)
    assert main(["status", str(run)]) == 0
    shown = rows(capsys.readouterr().out)
    assert shown["sleeper"].split()[2:4] == ["CANCELLED", "1"], shown
    assert shown["after"].split()[2:4] == ["CANCELLED", "1"], shown

    start = time.monotonic()
    assert main(["logs", str(run), "sleeper", "--follow"]) == 0
    assert time.monotonic() - start < 5  # no wait for the next look at the job's state
    assert "started" in capsys.readouterr().out.splitlines()
    if launcher is not None:
        # The launcher ends, saying so; the task's process group is gone.
        assert launcher.wait(timeout=30) == 1
        assert "local run cancelled: sleeper, after did not complete" in (
            launcher.stdout.read() if launcher.stdout else ""
        )
        record = local_jobs.read(RunPaths(run).state_file("toy", "sleeper"))
        assert record is not None and record.tasks[0].pgid is not None
        assert not local_jobs.group_alive(record.tasks[0].pgid)
