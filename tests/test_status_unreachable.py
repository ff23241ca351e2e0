"""What `status`, `status --watch`, `logs --follow` and `cancel` say when Slurm cannot be asked: the real
Slurm commands against the test cluster's slurm.conf with its controller port changed to one nothing
listens on (the shared cluster keeps running), and with no Slurm command on PATH."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO
from slurm.cluster import SlurmCluster
from slurm.config import free_ports
from toy_pipeline import sleeper_plan

from launcher import manifest, relaunch
from launcher.backends import prepare
from launcher.backends.slurm import SlurmBackend
from launcher.cli import main as cli_main
from launcher.errors import LauncherError
from launcher.job_states import controller, status
from launcher.status.cli import main

# The client's wait for a controller that does not answer (slurm.conf MessageTimeout, default 10 s).
TIMEOUT_S = 2
JOBS = 4


def test_the_controller_is_named_from_slurm_conf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "ClusterName=c\nslurmctldhost=ctl1(10.0.0.1)\nSlurmctldHost=ctl2\nSlurmctldPort=6820-6821\n"
    )
    monkeypatch.setenv("SLURM_CONF", str(conf))
    assert controller() == f"ctl1:6820-6821 (SLURM_CONF={conf})"
    conf.write_text("ControlMachine=head # old spelling\n")
    assert controller() == f"head:6817 (SLURM_CONF={conf})"
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "absent.conf"))  # a configless client
    assert controller() == ""


@pytest.fixture
def pending_run(slurm_shared: Path, drained: None) -> Iterator[Path]:
    """JOBS jobs really PENDING on the test cluster (its nodes drained), cancelled afterwards."""
    run = slurm_shared / "run"
    SlurmBackend().schedule(prepare(sleeper_plan(run, jobs=JOBS - 1)))
    yield run
    main(["cancel", str(run)])


@pytest.fixture
def dead_conf(slurm_cluster: SlurmCluster, tmp_path: Path) -> tuple[Path, str]:
    """A copy of the cluster's slurm.conf whose controller port nothing listens on, and the live text."""
    live = slurm_cluster.conf.read_text()
    port = free_ports(1)[0]
    conf = tmp_path / "slurm.conf"
    dead = re.sub(r"(?m)^SlurmctldPort=.*$", f"SlurmctldPort={port}", live)
    conf.write_text(f"{dead}MessageTimeout={TIMEOUT_S}\n")
    return conf, live


def test_status_and_cancel_say_in_one_line_that_the_controller_did_not_answer(
    pending_run: Path,
    dead_conf: tuple[Path, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert {st.states["PENDING"] for st in status(pending_run)} == {1}  # read from the live controller
    conf, _ = dead_conf
    monkeypatch.setenv("SLURM_CONF", str(conf))
    port = re.search(r"(?m)^SlurmctldPort=(\d+)", conf.read_text()).group(1)  # type: ignore[union-attr]
    start = time.monotonic()
    assert main(["status", str(pending_run)]) == 1
    took = time.monotonic() - start
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1, err
    assert err.startswith(
        f"error: cannot tell the state of this run's jobs: the Slurm controller localhost:{port} "
    )
    assert "Unable to contact slurm controller" in err and "accounting storage is disabled" in err
    # One query waits out the timeout, not one per job.
    assert TIMEOUT_S <= took < TIMEOUT_S * JOBS, took

    assert main(["cancel", str(pending_run)]) == 1
    out, err = capsys.readouterr()
    assert len(err.splitlines()) == 1 and err.startswith("error: could not cancel jobs "), err
    assert f"the Slurm controller localhost:{port} " in err
    # Nor is a job that may be live submitted again.
    with pytest.raises(LauncherError, match=f"cannot tell which jobs of {pending_run} still run: the Slurm"):
        relaunch.request_for(sleeper_plan(pending_run, jobs=JOBS - 1), True, "slurm")


def test_a_launch_with_the_controller_down_is_refused_in_one_line_writing_nothing(
    slurm_shared: Path,
    dead_conf: tuple[Path, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The demo's data steps for the real cluster (sbatch and scontrol are there) while its controller does
    not answer: one line naming it, before any file is written; nothing said to be submitted."""
    conf, _ = dead_conf
    monkeypatch.setenv("SLURM_CONF", str(conf))
    port = re.search(r"(?m)^SlurmctldPort=(\d+)", conf.read_text()).group(1)  # type: ignore[union-attr]
    argv = [
        f"cluster.shared_dir={slurm_shared}",
        "cluster=slurm",
        "data_preparation=demo",
        "data_preparation.precache.enable=false",
        "stages=[data_preparation]",
    ]
    assert cli_main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1, (out, err)
    assert err.startswith(
        f"error: cluster: cannot submit: the Slurm controller localhost:{port} (SLURM_CONF={conf}) did not "
        "answer (scontrol: "
    ), err
    assert err.rstrip().endswith(" dry_run=true"), err  # the command to look at the plan instead
    assert list(slurm_shared.iterdir()) == []


def _launcher(command: str, *args: str, conf: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "launcher", command, *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "SLURM_CONF": str(conf), "COLUMNS": "100"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_watch_and_follow_wait_while_the_controller_is_down_and_end_when_they_see_the_end(
    pending_run: Path, dead_conf: tuple[Path, str]
) -> None:
    conf, live = dead_conf
    watch = _launcher("status", str(pending_run), "--watch", "--interval", "0.5", conf=conf)
    follow = _launcher("logs", str(pending_run), "sleeper", "--follow", conf=conf)
    assert watch.stdout is not None and follow.stderr is not None
    try:
        # Two frames (it asked again after the first) and the follower's word that it goes on.
        first = [watch.stdout.readline(), watch.stdout.readline(), follow.stderr.readline()]
        assert watch.poll() is None and follow.poll() is None  # neither takes "unknown" for an end
        conf.write_text(live)  # the controller answers again: the jobs are still pending
        ids = [i for r in manifest.load(pending_run) for i in r.ids]
        subprocess.run(["scancel", *ids], env={**os.environ, "SLURM_CONF": str(conf)}, check=True)
        watched, follows = watch.communicate(timeout=30), follow.communicate(timeout=30)
    finally:
        for process in (watch, follow):
            process.kill()
            process.wait()
    for frame in first[:2]:
        assert "cannot tell the state of this run's jobs: the Slurm controller localhost:" in frame, first
        assert frame.rstrip().endswith("asking again every 0.5 s"), first
    assert watch.returncode == 143, watched  # it saw the end: the jobs were cancelled (launcher.errors)
    frames = watched[0].splitlines()
    assert [line.split()[2:4] for line in frames if line.startswith("sleeper ")][-1] == ["CANCELLED", "1"]
    # The job was cancelled before it ran: no log to follow, said once it has ended.
    assert follow.returncode == 1, follows
    assert first[2].startswith("still following: the Slurm controller localhost:"), first
    assert follows[1].splitlines()[-1].startswith("no log yet for sleeper"), follows
    assert follows[1].splitlines()[-1].endswith("and it is CANCELLED 1"), follows


def test_without_slurm_commands_one_line_and_no_errno(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run submitted to Slurm, looked at from a host without its commands."""
    run = tmp_path / "run"
    run.mkdir()
    manifest.save(
        run, [manifest.JobRecord("toy", "sleeper", "12", None, "s", str(run / "l_%j.out"), [], "slurm")]
    )
    monkeypatch.setenv("PATH", str(tmp_path))
    for command, says in (
        ("status", "error: cannot tell the state of this run's jobs: scontrol is not on this host's PATH"),
        ("cancel", "error: could not cancel jobs 12: scancel is not on this host's PATH"),
    ):
        assert main([command, str(run)]) == 1
        out, err = capsys.readouterr()
        assert out == "" and len(err.splitlines()) == 1 and err.startswith(says), err
        assert "Errno" not in err and "run this on a node of the Slurm cluster" in err
