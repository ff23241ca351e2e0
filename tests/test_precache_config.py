"""The cached-latents switch (data_preparation.precache) as the launcher plans and refuses it.

Bad settings are refused before submission in tests/test_config_validation.py (LATENT_CASES, and the
encode step without a NeMo interpreter). Here: the storage cost in the dry run, the plan on local, and
preflight refusing a latent config on image tars. The encode program and NeMo's own code on the
latents: tests/test_latents_nemo.py.
"""

from __future__ import annotations

import io
import pickle
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import aws_argv, compose_config

from data_prep.latent_format import sample_bytes
from launcher import manifest
from launcher.cli import launch
from launcher.context import Facts
from launcher.errors import LauncherError


def test_the_dry_run_prints_bytes_per_sample_and_the_total(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    launch(compose_config([*aws_argv(tmp_path), "dry_run=true"]))
    out = " ".join(capsys.readouterr().out.split())
    per_sample = sample_bytes((8, 32, 32), (80, 768))
    assert per_sample == 140_288  # 8x32x32 + 80x768 float16, pickled, plus a 512-byte tar header
    assert f"precache: {per_sample:,} bytes per sample" in out
    assert "at most 1,739.7 GB for 12,400,000 rows in 12,400 tars" in out
    capsys.readouterr()
    launch(
        compose_config(
            [*aws_argv(tmp_path), "dry_run=true", "data_preparation.download_parquet.max_rows=1000"]
        )
    )
    assert "at most 0.1 GB for 1,000 rows in 1 tars" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize(
    ("moments", "text"),
    [((8, 32, 32), (80, 768)), ((8, 64, 64), (80, 1024)), ((2, 4, 4), (8, 8)), ((8, 100, 100), (80, 768))],
)
def test_the_estimate_is_at_most_one_block_above_the_real_tar_member(moments: tuple, text: tuple) -> None:
    """sample_bytes is arithmetic (planning never imports numpy); the real member is numpy's pickle."""
    import numpy as np

    from data_prep.latent_format import dumps_sample

    member = dumps_sample(np.ones(moments, np.float32), np.ones(text, np.float32))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("000000000.pickle")
        info.size = len(member)
        tar.addfile(info, io.BytesIO(member))
        real = tar.offset  # header and padded data of the one member, before the closing blocks
    assert real <= sample_bytes(moments, text) <= real + 512


def test_off_by_default_on_local_and_on_when_asked_it_encodes_on_cpu(tmp_path: Path) -> None:
    facts = Facts(python=sys.executable, code_dir=str(tmp_path), nemo_python="/venv-nemo/bin/python")
    base = [f"cluster.shared_dir={tmp_path}", "dry_run=true"]
    run = launch(compose_config(base), facts)
    assert "encode_latents" not in {r.name for r in manifest.load(run)}
    run = launch(compose_config([*base, "data_preparation.precache.enable=true", "run_name=on"]), facts)
    jobs = {r.name: r for r in manifest.load(run)}
    # The staged VAE and CLIP it reads: the assets job is planned for it (the downloads do not wait).
    assert jobs["encode_latents"].depends_on == ["afterok:generate_wdinfo", "afterok:pretrained_assets"]
    assert jobs["make_demo_source"].depends_on == []
    assert jobs["latents_wdinfo"].depends_on == ["afterok:encode_latents"]
    script = (run / "data_preparation/encode_latents.sbatch").read_text()
    assert "/venv-nemo/bin/python -m data_prep.encode_latents encode" in script
    assert "--device cpu" in script and "--gpus-per-node" not in script


def _tar_with(path: Path, member: str) -> None:
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo(member)
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))


@pytest.mark.parametrize(("switch", "member"), [("true", "000000.jpg"), ("false", "000000.pickle")])
def test_preflight_refuses_a_latent_config_on_image_tars_or_the_reverse(
    tmp_path: Path, switch: str, member: str
) -> None:
    folder = tmp_path / ("data/tarfiles_latents" if switch == "true" else "data/tarfiles_reorganized")
    folder.mkdir(parents=True)
    _tar_with(folder / "000000.tar", member)
    info = {"tar_files": ["000000.tar"] * 16, "chunk_size": 1, "total_key_count": 16}
    (folder / "wdinfo.pkl").write_bytes(pickle.dumps(info))
    argv = [*aws_argv(tmp_path), "stages=[training]", f"data_preparation.precache.enable={switch}"]
    with pytest.raises(LauncherError, match=f"data_preparation.precache.enable={switch.capitalize()}"):
        launch(compose_config([*argv, "training.trainer.num_nodes=2"]))
    assert not (tmp_path / "results").exists()


def test_preflight_names_the_switch_when_only_image_tars_are_there(tmp_path: Path) -> None:
    """stages=[training] on a preset with cached latents over data prepared from images alone."""
    folder = tmp_path / "data/tarfiles_reorganized"
    folder.mkdir(parents=True)
    _tar_with(folder / "000000.tar", "000000.jpg")
    info = {"tar_files": ["000000.tar"] * 16, "chunk_size": 1, "total_key_count": 16}
    (folder / "wdinfo.pkl").write_bytes(pickle.dumps(info))
    argv = [*aws_argv(tmp_path), "stages=[training]", "training.trainer.num_nodes=2"]
    with pytest.raises(LauncherError) as error:
        launch(compose_config(argv))  # aws_p5: the switch is on without being typed
    message = " ".join(str(error.value).split())
    assert "data_preparation.precache.enable=true (cached latents)" in message
    assert f"holds only image tars ({folder / 'wdinfo.pkl'})" in message
    assert "stages=[data_preparation]" in message and "data_preparation.precache.enable=false" in message
    assert not (tmp_path / "results").exists()
    # Without the switch the same data trains: the launch gets past preflight (a dry run writes it).
    launch(compose_config([*argv, "data_preparation.precache.enable=false", "dry_run=true"]))
