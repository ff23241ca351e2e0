"""Bad input fails before anything is written or submitted, naming the key and what is allowed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, compose_config

from launcher.errors import ConfigError
from launcher.main import launch

BAD_INPUTS = [
    (["stages=[data_prep]"], "stages", "data_preparation"),
    (["+cluster.gpu_per_node=8"], "cluster.gpu_per_node", "gpus_per_node"),
    (["cluster.gpus_per_node=eight"], "cluster.gpus_per_node", "eight"),
    (["data_preparation.num_partitions=0"], "data_preparation.num_partitions", "at least 1"),
    (["data_preparation.download_images.resize_mode=false"], "resize_mode", '"no"'),
    (["data_preparation.download_images.resize_mode=crop"], "resize_mode", "center_crop"),
    (["cluster=aws_p5", "container.image=apps/nemo.sqsh"], "container.image", "absolute"),
    (["cluster=aws_p5", "container.image=null"], "container.image", "required"),
    (["cluster=aws_p5", "container.mounts=[/data:/data]"], "data_dir", "container.mounts"),
    (["cluster=local", "container=pyxis"], "container.runtime", "container=none"),
    (["+env.HF_TOKEN=hf_abc"], "env.HF_TOKEN", "file"),
    (["cluster=aws_p5", "stages=[training]", "training.model.global_batch_size=1000",
      "training.trainer.num_nodes=1", "training.model.micro_batch_size=64"],
     "training.model.global_batch_size", "[512, 1024]"),
    (["cluster=aws_p5", "stages=[training]", "+training.trainer.devices=4"], "training.trainer.devices", "agree"),
    (["cluster=aws_p5", "stages=[training]", "training.trainer.accumulate_grad_batches=2"],
     "accumulate_grad_batches", "must stay 1"),
    (["stages=[training]"], "cluster.gpus_per_node", "aws_p5"),
    (["cluster=aws_p5", "training.run.chain=0"], "training.run.chain", "at least 1"),
    (["+training.run.nodes=2"], "training.run.nodes", "allowed keys"),
    (["cluster=aws_p5", "stages=[training]", "assets.vae.revision=main"], "assets.vae.revision",
     "commit sha"),
    (["cluster=aws_p5", "stages=[training]", "assets.dir=/models"], "assets.text_encoder.local_dir",
     "container.mounts"),
    (["stages=[assets]", "assets.text_encoder.files=[]"], "assets.text_encoder.files", "file names"),
]


@pytest.mark.parametrize(("overrides", "key", "hint"), BAD_INPUTS, ids=lambda v: str(v))
def test_bad_input_is_refused_before_anything_is_written(
    overrides: list[str], key: str, hint: str, tmp_path: Path
) -> None:
    base = [f"cluster.shared_dir={tmp_path}", "dry_run=false"]
    if any(o.startswith("cluster=aws") for o in overrides) and not any("mounts" in o for o in overrides):
        base.append(f"container.mounts=[{tmp_path}:{tmp_path}]")
    with pytest.raises(ConfigError) as error:
        launch(compose_config(overrides + base))
    message = str(error.value)
    assert key in message and hint in message, message
    assert list(tmp_path.iterdir()) == [], "something was written before the error"


def test_cli_reports_the_error_and_exits_2(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "launcher/main.py"), f"cluster.shared_dir={tmp_path}",
         "data_preparation.num_partitions=-1"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2
    assert "data_preparation.num_partitions: must be at least 1, got -1" in done.stderr
    assert "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_unknown_group_option_lists_the_choices(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "launcher/main.py"), "cluster=aws_p6", f"cluster.shared_dir={tmp_path}"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode != 0
    assert "aws_p5" in done.stderr and "aws_p4de" in done.stderr
