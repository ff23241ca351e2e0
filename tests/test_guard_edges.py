"""No traceback at the edges: a real Slurm launch on a host without sbatch is refused before anything is
written; make_executor says in one line that srun is missing, and runs the function here on
cluster=local; a preset that is not there names the group's presets; a key that is not there names the
nearest known keys."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, compose_config, conf_presets
from omegaconf import OmegaConf

from launcher.cli import main
from launcher.errors import ConfigError
from launcher.executor import make_executor

SLURM_PRESETS = ("slurm", "aws_p5", "aws_p4de")


def _launcher(argv: list[str], cwd: Path, path: str) -> subprocess.CompletedProcess[str]:
    """`python launcher/main.py` as a user runs it, with PATH as given (the interpreter by its path)."""
    env = {**os.environ, "PATH": path, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, str(REPO / "launcher/main.py"), *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("cluster", SLURM_PRESETS)
def test_a_real_launch_without_sbatch_is_refused_before_anything_is_written(
    tmp_path: Path, cluster: str
) -> None:
    """The README's command on a host whose PATH has no Slurm: one line naming `cluster` and
    dry_run=true, and the shared folder (results, data) stays as it was: empty."""
    shared, bare_path = tmp_path / "shared", tmp_path / "bin"
    shared.mkdir()
    bare_path.mkdir()
    (shared / "nemo.sqsh").write_bytes(b"hsqs")  # the image exists: only sbatch is missing
    argv = [
        f"cluster={cluster}",
        "container=pyxis",  # data_check, training in the image (no NeMo interpreter needed here)
        "stages=[data_preparation,training]",
        f"cluster.shared_dir={shared}",
        f"container.mounts=[{shared}:{shared}]",
        f"container.image={shared}/nemo.sqsh",
    ]
    done = _launcher(argv, tmp_path, str(bare_path))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("error: cluster: ") and "dry_run=true" in done.stderr, done.stderr
    assert "sbatch" in done.stderr and "Traceback" not in done.stderr
    assert _files(shared) == ["nemo.sqsh"] and _files(tmp_path / "bin") == []
    # The refusal is the missing sbatch: the dry run it names works on this host and writes the run folder.
    done = _launcher([*argv, "dry_run=true"], tmp_path, str(bare_path))
    assert done.returncode == 0, done.stderr
    assert (shared / "results/sd_860m_res_256/manifest.json").is_file()


def test_make_executor_without_srun_fails_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no srun (and no other Slurm command) on this host
    with pytest.raises(ConfigError) as refused:
        make_executor(
            tmp_path / "jobs",
            "cluster=aws_p5",
            f"cluster.shared_dir={tmp_path}",
            f"container.mounts=[{tmp_path}:{tmp_path}]",
        )
    message = str(refused.value)
    assert "\n" not in message and message.startswith("cluster: ") and "srun" in message, message
    assert "cluster=local" in message
    assert not (tmp_path / "jobs").exists()


def test_make_executor_on_cluster_local_runs_the_function_here_in_the_jobs_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the local backend does with the rendered scripts: this machine, the jobs' env and folder;
    no Slurm command needed (PATH holds none)."""
    monkeypatch.setenv("PATH", str(tmp_path))
    ex = make_executor(
        tmp_path / "jobs", "cluster=local", f"cluster.shared_dir={tmp_path}", "+env.GUARD_PROBE='it is here'"
    )
    job = ex.submit(lambda: (os.environ.get("GUARD_PROBE"), os.getcwd(), os.environ.get("PYTHONPATH")))
    probe, cwd, pythonpath = job.result()
    assert probe == "it is here"
    assert Path(cwd) == REPO and str(REPO) in (pythonpath or "").split(":")
    with pytest.raises(ConfigError, match=r"^nodes: 2; the local backend runs on this one machine"):
        make_executor(tmp_path / "jobs", "cluster=local", f"cluster.shared_dir={tmp_path}", nodes=2)


def _refusal(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The launcher's stderr for argv (composition only: --cfg): one line, exit 2."""
    assert main([*argv, "--cfg"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "search path" not in err and "Traceback" not in err
    return err.removeprefix("error: ").rstrip("\n")


_presets = conf_presets


@pytest.mark.parametrize(
    ("group", "value"),
    [
        ("training", "stable_diffusion/860m_res_512_v1_3"),
        ("data_preparation", "aws_p5"),
        ("cluster", "aws_p6"),
    ],
)
def test_a_missing_preset_names_the_groups_presets(
    capsys: pytest.CaptureFixture[str], group: str, value: str
) -> None:
    err = _refusal(capsys, f"{group}={value}")
    assert err.startswith(f"{group}: no preset {value!r}; allowed: "), err
    assert err.split("allowed: ")[1].split(", ") == _presets(group)
    assert len(_presets(group)) >= 4


@pytest.mark.parametrize(
    ("override", "key", "nearest"),
    [
        ("training.trainer.max_step=1", "training.trainer.max_step", "training.trainer.max_steps"),
        ("traning.trainer.max_steps=1", "traning.trainer.max_steps", "training.trainer.max_steps"),
        ("cluster.partiton=gpu", "cluster.partiton", "cluster.partition"),
        (
            "data_preparation.precache.enabled=true",
            "data_preparation.precache.enabled",
            "data_preparation.precache.enable",
        ),
        ("precache.enable=false", "precache.enable", "data_preparation.precache.enable"),
        ("clusterr=slurm", "clusterr", "cluster"),
        ("~training.trainer.max_step", "training.trainer.max_step", "training.trainer.max_steps"),
    ],
)
def test_an_unknown_key_names_the_nearest_known_keys(
    capsys: pytest.CaptureFixture[str], override: str, key: str, nearest: str
) -> None:
    err = _refusal(capsys, "cluster=slurm", override)
    assert err.startswith(f"{key}: unknown key; nearest: "), err
    named = err.split("nearest: ")[1].split(", ")
    assert named[0] == nearest and len(named) <= 3
    composed = OmegaConf.to_container(compose_config(["cluster=slurm"]), resolve=False)
    for path in named:  # each a key of the composed config
        node = composed
        for part in path.split("."):
            node = node[part]


def test_a_key_with_nothing_near_names_the_keys_allowed_where_it_stops_matching(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = _refusal(capsys, "foo.bar=1")
    assert err.startswith("foo.bar: unknown key; allowed keys in the top level: "), err
    assert err.split(": ", 2)[2].removeprefix("allowed keys in the top level: ").split(", ") == list(
        compose_config([])
    )
    err = _refusal(capsys, "env.MY_SETTING=1")  # a new variable: the documented +env.NAME=value
    assert err == "env.MY_SETTING: not set yet; a new variable takes a leading +: +env.MY_SETTING=1"


def test_the_refusals_are_one_line_from_the_command_line(tmp_path: Path) -> None:
    """As a user sees them: `python launcher/main.py ...` prints one line, no Hydra noise."""
    for argv in (
        ["training=stable_diffusion/860m_res_512_v1_3"],
        ["foo.bar=1"],
        ["training.trainer.max_step=1"],
    ):
        done = _launcher(argv, tmp_path, os.environ["PATH"])
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith("error: ") and "Config search path" not in done.stderr
    assert _files(tmp_path) == []
