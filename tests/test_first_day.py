"""The first day on a real cluster (issue 48), as a user types it: the docs' cluster commands launched for
real off the cluster write nothing anywhere (a search of the whole file system), each mistake of the day
is answered in one line with a command that, typed as printed, is accepted, and the launch's exit status
says one thing (launcher.errors)."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FIXED_FACTS, REPO
from fixtures.docs import GENERIC_SLURM, launch_commands
from fixtures.slurm import slurm_required

from launcher import cli, manifest

# Where nothing is searched: the kernel's and the temporary folders (this test's own among them), and
# bytecode and pytest caches, which other processes of a test run write (the launches here write none).
NOT_SEARCHED = ("/proc", "/sys", "/dev", "/run", "/tmp", "/var/tmp")
CACHES = ("__pycache__", ".pytest_cache")


def _in_another_checkout(path: Path) -> bool:
    """Whether `path` lies in a git checkout other than this one: what its own tests and tools write
    meanwhile (on a machine shared by several checkouts) is not this test's launches'."""
    top = next((folder for folder in path.parents if (folder / ".git").exists()), None)
    return top is not None and top != REPO


def _open_before() -> set[str]:
    """The files some process holds open now, before the launches: what is appended to meanwhile by
    whoever runs this test (CI's own log, a terminal's transcript) cannot be the launches' doing."""
    held = set()
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        try:
            held.add(os.readlink(fd))
        except OSError:  # the process or the descriptor ended meanwhile, or is not ours to read
            continue
    return held


def _cluster_commands() -> list[list[str]]:
    """The README's, docs/datasets.md's and docs/generic-slurm.md's launches on a cluster's shared file
    system (/fsx, /shared), as submissions (without dry_run), from launcher/main.py on."""
    pages = [REPO / "README.md", REPO / "docs/datasets.md", GENERIC_SLURM]
    found: list[list[str]] = []
    for words in (words for page in pages for words in launch_commands(page)):
        real = [word for word in words if word != "dry_run=true"]
        on_a_cluster = any(word.startswith(("cluster=aws_", "cluster.shared_dir=/")) for word in real)
        if real[1:2] == ["launcher/main.py"] and on_a_cluster and real[1:] not in found:
            found.append(real[1:])
    return found


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_the_docs_cluster_commands_off_the_cluster_write_nothing_anywhere(tmp_path: Path) -> None:
    """This machine has Slurm's client and no /fsx (nor /shared): each command exits 2 in one line naming
    the missing folder, with the command that shows the plan instead; that one, typed as printed, is
    accepted. Then no file anywhere is newer than the first launch."""
    missing = [top for top in ("/fsx", "/shared") if os.path.exists(top)]
    if missing or shutil.which("sbatch") is None:
        reason = f"needs Slurm's client and no {', '.join(missing) or '/fsx'} on this machine"
        if slurm_required():
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    commands = _cluster_commands()
    assert len(commands) == 3, commands
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"} | {"PYTHONDONTWRITEBYTECODE": "1"}
    marker = tmp_path / "before-the-launches"
    marker.write_text("")
    held = _open_before()
    typed = []
    for words in commands:
        done = _run([sys.executable, *words], env)
        top = "/shared" if "cluster.shared_dir=/shared/sd" in words else "/fsx"
        assert done.returncode == 2 and done.stdout == "", (words, done.stdout, done.stderr)
        [line] = done.stderr.splitlines()
        assert line.startswith(f"error: cluster.shared_dir: {top}") and " is not on this host" in line, line
        instead = line.partition("; type instead: ")[2]
        assert shlex.split(instead)[1:] == [*words, "dry_run=true"], line
        typed.append(instead)
    for line in typed:  # typed as printed, in the same folder: the plan, and nothing written
        done = subprocess.run(
            ["bash", "-c", line], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        assert "nothing written: " in done.stdout, done.stdout[-2000:]
    prune = [f for path in NOT_SEARCHED for f in ("-path", path, "-o")]
    prune += [f for name in CACHES for f in ("-name", name, "-o")]
    search = ["find", "/", "(", *prune[:-1], ")", "-prune", "-o", "-newer", str(marker), "-print"]
    found = subprocess.run(search, capture_output=True, text=True, timeout=300).stdout.splitlines()
    assert [path for path in found if path not in held and not _in_another_checkout(Path(path))] == []
    assert not os.path.exists("/fsx") and not os.path.exists("/shared")


def _typed_again(line: str, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The command the refusal printed, as the shell splits it, less its interpreter and script."""
    assert line.count("\n") == 0 and line.startswith("error: "), line
    words = shlex.split(line.partition("; type instead: ")[2])
    assert words[:2] == [sys.executable, "launcher/main.py"], line
    capsys.readouterr()
    return words[2:]


def _refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err.rstrip("\n")


MISTAKES = [
    (["stages=training"], "stages: takes a list, written in brackets; allowed: ", ["stages=[training]"]),
    (
        ["stages=data_preparation,training"],
        "stages: a list is written in brackets: stages=[data_preparation,training]",
        ["stages=[data_preparation,training]"],
    ),
    (
        ["--multirun", "stages=data_preparation,training"],
        "--multirun: the launcher runs no Hydra sweep (one plan per launch",
        ["stages=[data_preparation,training]"],
    ),
    (["-m", "stages=[training]"], "-m: the launcher runs no Hydra sweep", ["stages=[training]"]),
    (
        ["stages=[training]", "training.trainer.max_steps=10,20"],
        "training.trainer.max_steps: takes one value per launch (the launcher sweeps nothing): "
        "training.trainer.max_steps=10",
        ["stages=[training]", "training.trainer.max_steps=10"],
    ),
    (
        ["container=nvcr.io/nvidia/nemo:24.07"],
        "container: picks the container runtime (none, pyxis); 'nvcr.io/nvidia/nemo:24.07' is an image, which "
        "container.image names",
        ["container=pyxis", "container.image=nvcr.io/nvidia/nemo:24.07"],
    ),
    (
        ["training=860m_res_256_1node"],
        "training: no preset '860m_res_256_1node'; it is stable_diffusion/860m_res_256_1node (its folder too)",
        ["training=stable_diffusion/860m_res_256_1node"],
    ),
]


@pytest.mark.parametrize(
    ("mistake", "said", "meant"), MISTAKES, ids=lambda v: " ".join(v) if isinstance(v, list) else ""
)
def test_each_mistake_gets_one_line_with_a_command_that_is_accepted(
    mistake: list[str],
    said: str,
    meant: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On the AWS preset's dry run (the checkout mounted, as on the cluster; its image is not on this
    host: a warning in a dry run): the refusal names what was meant, and the command it prints is the
    user's own with that put right."""
    monkeypatch.setattr(sys, "argv", ["launcher/main.py"])
    monkeypatch.setattr(cli, "host_facts", lambda: FIXED_FACTS)
    context = [
        "cluster=aws_p5",
        f"cluster.shared_dir={tmp_path}",
        f"container.mounts=[{tmp_path}:{tmp_path},{REPO}:{REPO}]",
        "dry_run=true",
    ]
    line = _refusal([*mistake, *context], capsys)
    assert line.removeprefix("error: ").startswith(said), line
    again = _typed_again(line, capsys)
    assert sorted(again) == sorted([*meant, *context]), again
    assert cli.main(again) == 0, capsys.readouterr().err
    assert list((tmp_path / "results").iterdir()), "the dry run wrote its plan"


def test_the_nemo_interpreter_refusal_names_the_switch_and_its_command_is_accepted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """cluster=slurm's data-only dry run on a checkout without a NeMo venv (cached latents are on there)."""
    import dataclasses

    monkeypatch.setattr(sys, "argv", ["launcher/main.py"])
    monkeypatch.setattr(cli, "host_facts", lambda: dataclasses.replace(FIXED_FACTS, nemo_python=None))
    argv = ["stages=[data_preparation]", "cluster=slurm", f"cluster.shared_dir={tmp_path}", "dry_run=true"]
    line = _refusal(argv, capsys)
    assert "to run encode_latents with;" in line, line
    assert (
        "; or plan without encode_latents: data_preparation.precache.enable=false (train from the images)"
        in line
    )
    again = _typed_again(line, capsys)
    assert again == [*argv, "data_preparation.precache.enable=false"]
    assert cli.main(again) == 0, capsys.readouterr().err
    # With training planned too, its own jobs cannot be planned away: the ways are named, no command.
    line = _refusal([*argv[1:], "stages=[data_preparation,training]"], capsys)
    assert "; or plan without encode_latents, data_check: data_preparation.precache.enable=false" in line
    assert "type instead" not in line


def test_a_printed_command_works_in_a_shell_as_printed(tmp_path: Path) -> None:
    """The launcher as a user starts it, then its printed command in a shell, from the same folder."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    words = ["stages=assets,data_preparation", f"cluster.shared_dir={tmp_path}", "dry_run=true"]
    done = _run([sys.executable, "launcher/main.py", *words], env)
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip().partition("; type instead: ")[2]
    assert line.startswith(f"{sys.executable} launcher/main.py 'stages=[assets,data_preparation]' "), line
    done = subprocess.run(
        ["bash", "-c", line], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    run = tmp_path / "results/sd_860m_res_256"
    assert {r.stage for r in manifest.load(run)} == {"assets", "data_preparation"}


def _local_launch(shared: Path) -> subprocess.Popen[str]:
    """The README's first command (the demo on the local backend) as a user starts it."""
    return subprocess.Popen(
        [sys.executable, "launcher/main.py", f"cluster.shared_dir={shared}"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _once_running(shared: Path, launched: subprocess.Popen[str]) -> Path:
    """The run folder once one of its jobs runs (the pace of this machine, not a figure under test)."""
    run = shared / "results/sd_860m_res_256"
    deadline = time.monotonic() + 120
    while not (run / manifest.MANIFEST).exists() or not list(run.glob("data_preparation/logs/*.out")):
        assert launched.poll() is None and time.monotonic() < deadline, launched.stderr
        time.sleep(0.1)
    return run


@pytest.mark.slow
@pytest.mark.parametrize(
    ("how", "status", "said"),
    [(signal.SIGINT, 130, "error: stopped by SIGINT"), (signal.SIGTERM, 143, "error: stopped by SIGTERM")],
    ids=["ctrl-c", "sigterm"],
)
def test_a_local_run_stopped_exits_with_its_signal_s_status(
    tmp_path: Path, how: signal.Signals, status: int, said: str
) -> None:
    """130 after Ctrl-C, 143 after SIGTERM (`cancel` from another shell: test_data_owner): the run's jobs
    are recorded CANCELLED, and no task of it runs on."""
    launched = _local_launch(tmp_path)
    run = _once_running(tmp_path, launched)
    launched.send_signal(how)
    _, err = launched.communicate(timeout=60)
    assert launched.returncode == status, err
    assert err.splitlines()[-1].startswith(said), err
    from launcher.job_states import status as states

    ended = {st.record.name: st for st in states(run)}
    assert not any(st.active for st in ended.values()), {n: st.summary() for n, st in ended.items()}
    assert "CANCELLED" in {st.end for st in ended.values()}


def test_a_job_sbatch_refuses_after_the_launch_wrote_its_files_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller answers (scontrol) but sbatch refuses the first job: the launch ran, and failed."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name, body in (
        ("scontrol", "echo 'MaxArraySize = 1001'; echo 'MaxJobCount = 10000'"),
        ("sbatch", "echo 'sbatch: error: invalid partition specified: gpu' >&2; exit 1"),
    ):
        (stubs / name).write_text(f"#!/bin/sh\n{body}\n")
        (stubs / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{stubs}:{os.environ['PATH']}")
    argv = [
        "cluster=slurm",
        f"cluster.shared_dir={tmp_path}",
        "data_preparation=demo",
        "stages=[data_preparation]",
    ]
    assert cli.main([*argv, "data_preparation.precache.enable=false", "container=none"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: sbatch refused data_preparation/make_demo_source (exit 1): sbatch: error: ")
    assert err.rstrip().endswith("Nothing after it was submitted; already submitted: none"), err
