"""The mistakes a new user makes in the first hour (issue 38), made as the user makes them, through the
command line (cli.main): each is refused in one line naming the key and a way out, and nothing is written
(no run folder, no launch lock, no script)."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
from pathlib import Path

import pytest
from conftest import REPO

from launcher import cli, data_owner, sizing
from launcher.relaunch import LOCK_NAME

SYNTHETIC = "training=stable_diffusion/860m_res_256_synthetic"


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one line the launch printed when it refused `argv`."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err.removeprefix("error: ").rstrip("\n")


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("dataset", ["demo", "pd12m"])
def test_data_preparation_for_a_synthetic_training_is_refused_with_its_cost(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dataset: str
) -> None:
    argv = [
        f"cluster.shared_dir={tmp_path}",
        "cluster.gpus_per_node=8",
        SYNTHETIC,
        f"data_preparation={dataset}",
    ]
    said = _refused([*argv, "stages=[data_preparation,training]"], capsys)
    rows = sizing.planned_rows(cli.to_schema(cli.compose_config([*argv, "stages=[training]"])))
    assert said.startswith(f"stages: data_preparation would fetch {rows:,} images, about "), said
    assert said.endswith(
        "plan without it: stages=[training] (or set training.model.data.synthetic_data=false to train on it)"
    )
    assert _files(tmp_path) == []
    assert cli.main([*argv, "stages=[training]", "dry_run=true"]) == 0  # the way out works


@pytest.mark.parametrize(
    ("key", "under"), [("data_dir", ""), ("base_results_dir", "/results"), ("cluster.shared_dir", "")]
)
@pytest.mark.parametrize("dry_run", ["true", "false"])
def test_a_folder_key_that_is_a_file_is_refused_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, under: str, dry_run: str
) -> None:
    (tmp_path / "afile").write_text("")
    path = f"{tmp_path}/afile{under}"
    said = _refused([f"cluster.shared_dir={tmp_path}", f"{key}={path}", f"dry_run={dry_run}"], capsys)
    what = "is a file" if not under else f"lies under {tmp_path}/afile, a file"
    assert said == f"{key}: {path!r} {what}, not a folder; give a folder's path"
    assert _files(tmp_path) == ["afile"]


def test_a_launch_refused_after_taking_the_run_folder_s_lock_leaves_no_stub(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another run writes the data folder (it holds its lock): the refusal comes once this launch holds its
    own run folder's lock, which it made; the folder goes with the lock."""
    data = tmp_path / "data"
    data.mkdir()
    holder = {"run_dir": "/elsewhere/run", "pid": 1, "backend": "local", "jobs": ["download_images"]}
    fd = os.open(data / data_owner.LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        said = _refused(
            [f"cluster.shared_dir={tmp_path}", f"data_dir={data}", "stages=[data_preparation]"], capsys
        )
    finally:
        os.close(fd)
    assert said.startswith(f"data folder {data} is being written by run /elsewhere/run"), said
    assert _files(tmp_path) == ["data", f"data/{data_owner.LOCK}"]
    assert not list(tmp_path.rglob(LOCK_NAME))


def test_a_data_folder_whose_lock_cannot_be_opened_is_named_and_leaves_no_stub(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The failure the trial met (its data_dir a file): the lock is opened inside the run folder's lock."""
    (tmp_path / "data" / data_owner.LOCK).mkdir(parents=True)  # not a file: os.open fails
    said = _refused([f"cluster.shared_dir={tmp_path}", "stages=[data_preparation]"], capsys)
    assert (
        said
        == f"data_dir: cannot open the data folder's lock {tmp_path}/data/{data_owner.LOCK}: Is a directory"
    )
    assert _files(tmp_path) == ["data", f"data/{data_owner.LOCK}"]


def test_a_yaml_error_in_a_conf_file_is_said_with_file_line_column_and_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "conf"
    shutil.copytree(REPO / "conf", conf)
    broken = conf / "training" / "mine.yaml"
    broken.write_text(
        "defaults:\n  - stable_diffusion/860m_res_256_pretrain@_here_\ntrainer:\n  max_steps: [1, 2\n"
    )
    monkeypatch.setattr(cli, "CONF", conf)
    said = _refused([f"cluster.shared_dir={tmp_path}", "training=mine"], capsys)
    assert said == (
        f"{broken}:4:14: not valid YAML (while parsing a flow sequence: did not find expected ',' or ']'): "
        "max_steps: [1, 2"
    )
    assert _files(tmp_path / "conf") == sorted([*_files(REPO / "conf"), "training/mine.yaml"])
    assert not (tmp_path / "results").exists()


def test_a_list_the_shell_split_at_a_space_gets_a_hint_that_works(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [f"cluster.shared_dir={tmp_path}", "cluster.gpus_per_node=8", "dry_run=true"]
    said = _refused(["stages=[data_preparation,", "training]", *argv], capsys)
    hinted = re.fullmatch(
        r"stages: the shell split its list at the spaces into separate arguments; "
        r"write it without spaces: (\S+)",
        said,
    )
    assert hinted, said
    assert _files(tmp_path) == []
    assert cli.main([hinted.group(1), *argv]) == 0
    run = tmp_path / "results/sd_860m_res_256"
    assert (run / "data_preparation").is_dir() and (run / "training").is_dir()  # both stages planned


def test_an_unclosed_list_is_not_hinted_to_be_quoted(capsys: pytest.CaptureFixture[str]) -> None:
    """A quoted list reaches the config as one string, refused as not a list: the hint says how to write one."""
    said = _refused(["stages=[data_preparation,"], capsys)
    assert "; write a list as stages=[a,b] (no spaces)" in said, said


# What torch raises for the two mismatches, raised by torch itself (NeMo's interpreter): a 64-wide text
# encoder into a 768-wide cross-attention (F.linear), 8-channel latents into a 4-channel first convolution.
_TORCH_ERRORS = """
import torch
linear, conv = torch.nn.Linear(768, 32), torch.nn.Conv2d(4, 32, 3)
for layer, x in ((linear, torch.zeros(80, 64)), (conv, torch.zeros(1, 8, 32, 32))):
    try:
        layer(x)
    except RuntimeError as exc:
        print(str(exc).splitlines()[0])
"""


def test_a_rehearsal_shape_mismatch_names_the_unet_key_at_fault(nemo_python: str) -> None:
    """The rehearsal's line for NeMo's error (launcher.jobs.rehearsal_step.nemo_error) on torch's own words."""
    import subprocess

    from omegaconf import OmegaConf

    from launcher.jobs.rehearsal_step import nemo_error

    done = subprocess.run([nemo_python, "-c", _TORCH_ERRORS], capture_output=True, text=True, timeout=300)
    linear, conv = done.stdout.splitlines()
    config = OmegaConf.create({"model": {"unet_config": {"context_dim": 768, "in_channels": 4}}})
    said = nemo_error(RuntimeError(linear), config)
    assert said.startswith(
        "training.model.unet_config.context_dim: the UNet's cross-attention takes 768-wide text embeddings, "
        "the text encoder gives 64; set context_dim=64 or stage the text encoder that gives 768 (RuntimeError: mat1"
    ), said
    said = nemo_error(RuntimeError(conv), config)
    assert said.startswith("training.model.unet_config.in_channels: the UNet's first convolution takes 4 "), (
        said
    )
    other = OmegaConf.create({"model": {"unet_config": {"context_dim": 1024}}})  # no key has the width
    assert nemo_error(RuntimeError(linear), other) == f"RuntimeError: {linear}"
