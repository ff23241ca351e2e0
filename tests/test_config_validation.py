"""Bad input fails before anything is written or submitted, naming the key and what is allowed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, aws_argv, compose_config

from launcher.cli import launch, main
from launcher.context import Facts
from launcher.errors import ConfigError

SDXL = "training=sdxl/sdxl_base_train_res_256_stage_1"
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
    (
        [
            "cluster=aws_p5",
            "stages=[training]",
            "training.model.global_batch_size=1000",
            "training.trainer.num_nodes=1",
            "training.model.micro_batch_size=64",
        ],
        "training.model.global_batch_size",
        "[512, 1024]",
    ),
    (
        ["cluster=aws_p5", "stages=[training]", "+training.trainer.devices=4"],
        "training.trainer.devices",
        "agree",
    ),
    (
        ["cluster=aws_p5", "stages=[training]", "training.trainer.accumulate_grad_batches=2"],
        "accumulate_grad_batches",
        "must stay 1",
    ),
    (["stages=[training]"], "cluster.gpus_per_node", "aws_p5"),
    (["cluster=aws_p5", "training.run.chain=0"], "training.run.chain", "at least 1"),
    (["+training.run.nodes=2"], "training.run.nodes", "allowed keys"),
    (
        ["cluster=aws_p5", "training.fault_tolerance.max_attempts_without_progress=-1"],
        "training.fault_tolerance.max_attempts_without_progress",
        "an integer, at least 0",
    ),
    (
        ["cluster=aws_p5", "training.fault_tolerance.node_check.checks=[gpus,ib]"],
        "training.fault_tolerance.node_check.checks[1]",
        "one of 'gpus', 'efa', 'filesystem'",
    ),
    (["cluster=aws_p5", "cluster.efa_devices_per_node=0"], "cluster.efa_devices_per_node", "at least 1"),
    (
        ["cluster=aws_p5", "stages=[training]", "assets.vae.revision=main"],
        "assets.vae.revision",
        "commit sha",
    ),
    (
        ["cluster=aws_p5", "stages=[training]", "assets.dir=/models"],
        "assets.text_encoder.local_dir",
        "container.mounts",
    ),
    (
        [
            "stages=[assets]",
            SDXL,
            "assets.sdxl_vae.nemo_vae.file=vae/config.json",
        ],
        "assets.sdxl_vae.nemo_vae.file",
        "is one of assets.sdxl_vae.files",
    ),
    (
        [
            "stages=[assets]",
            SDXL,
            "assets.sdxl_vae.nemo_vae.source=vae.bin",
        ],
        "assets.sdxl_vae.nemo_vae.source",
        "'vae.bin' is not one of assets.sdxl_vae.files",
    ),
    *(
        (
            ["cluster=slurm", "stages=[training]", SDXL, "data_preparation.precache.enable=false", override],
            key,
            hint,
        )
        for override, key, hint in (
            (
                "+training.model.fsdp_sharding_strategy=hybrid",
                "training.model.fsdp_sharding_strategy",
                "'full' or",
            ),
            (
                "training.trainer.precision=32-true",
                "training.trainer.precision",
                "FSDP mixed-precision recipe",
            ),
            (
                "training.model.optim.name=distributed_fused_adam",
                "training.model.optim.name",
                "Distributed optim",
            ),
        )
    ),
    (
        ["stages=[assets]", "assets.text_encoder.files=[]"],
        "assets.text_encoder.files",
        "a file name in the repo",
    ),
    (
        ["cluster=aws_p5", "stages=[training]", "training.run.time_limit=4"],
        "training.run.stop_before_limit_s",
        "1200 s leaves no training time in the job's limit 4 (training.run.time_limit)",
    ),
    (
        ["container.mounts=/a:/a"],
        "container.mounts",
        "takes a list, written in brackets; allowed: a list",
    ),
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
        [
            sys.executable,
            str(REPO / "launcher/main.py"),
            f"cluster.shared_dir={tmp_path}",
            "data_preparation.num_partitions=-1",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert (
        done.stderr
        == "error: data_preparation.num_partitions: -1 is too small; allowed: an integer, at least 1\n"
    )
    assert "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_unknown_group_option_lists_the_choices(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "launcher/main.py"), "cluster=aws_p6", f"cluster.shared_dir={tmp_path}"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode != 0
    assert "aws_p5" in done.stderr and "aws_p4de" in done.stderr


# The cases of issue 12, each typed alone into the full AWS pipeline with the image present.
ISSUE_CASES = [
    (
        "training.trainer.num_nodes=0",
        "training.trainer.num_nodes: 0 is too small; allowed: an integer, at least 1",
    ),
    ("training.model.micro_batch_size=0", "training.model.micro_batch_size: 0 is too small; allowed:"),
    (
        "cluster.time_limit=forever",
        "cluster.time_limit: 'forever' is not a Slurm time; allowed: a Slurm time:",
    ),
    ("run_name=", "run_name: '' is empty; allowed: a single path component"),
    ("run_name=a/b", "run_name: 'a/b' has the wrong form; allowed: a single path component"),
    (
        "data_preparation.download_parquet.source=",
        "data_preparation.download_parquet.source: '' is empty; allowed:",
    ),
    (
        "training.trainer.precision=fp16",
        "training.trainer.precision: 'fp16' is not a choice; allowed: one of",
    ),
    ("data_check.num_workers=-1", "data_check.num_workers: -1 is too small; allowed:"),
    ("training.model.data.num_workers=-4", "training.model.data.num_workers: -4 is too small; allowed:"),
    (
        "data_preparation.download_images.processes=-1",
        "data_preparation.download_images.processes: -1 is too",
    ),
    (
        "data_preparation.download_images.threads=-8",
        "data_preparation.download_images.threads: -8 is too small",
    ),
]


def test_the_aws_pipeline_without_a_bad_value_is_submitted(
    tmp_path: Path, recording_sbatch: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The control of the cases below: the same command reaches sbatch."""
    assert main(aws_argv(tmp_path)) == 0, capsys.readouterr().err
    # assets, 4 data steps, encode + wdinfo of the cached latents, data_check, training
    assert len(recording_sbatch.read_text().splitlines()) == 9


@pytest.mark.parametrize(("override", "message"), ISSUE_CASES, ids=[c[0] for c in ISSUE_CASES])
def test_issue_cases_exit_2_naming_key_value_and_what_is_allowed(
    override: str, message: str, tmp_path: Path, recording_sbatch: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _refused([override], message, tmp_path, recording_sbatch, capsys)


def _refused(
    overrides: list[str],
    message: str,
    tmp_path: Path,
    recording_sbatch: Path,
    capsys: pytest.CaptureFixture[str],
) -> str:
    """Exit 2, the error starts with `message`, nothing written, sbatch not called; the error text."""
    assert main([*aws_argv(tmp_path), *overrides]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}"), err
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nemo.sqsh"], "something was written"
    assert not recording_sbatch.exists(), "sbatch was called"
    return err


def test_data_check_without_a_nemo_interpreter_is_refused_with_the_fix(tmp_path: Path) -> None:
    no_venv = Facts(python=sys.executable, code_dir=str(tmp_path / "checkout"))
    with pytest.raises(ConfigError) as error:
        launch(
            compose_config([f"cluster.shared_dir={tmp_path}", "stages=[data_preparation,data_check]"]),
            no_venv,
        )
    # The key every NeMo job shares; the job's own key is named as the narrower fix.
    assert error.value.key == "training.run.python"
    assert "to run data_check with" in str(error.value) and "data_check.python for one" in str(error.value)
    assert (
        f"cd {tmp_path}/checkout && python3 -m venv .venv-nemo && .venv-nemo/bin/pip install -r "
        "requirements-nemo.txt" in str(error.value)
    )
    assert list(tmp_path.iterdir()) == []
    # Nor the encode step of the cached latents, which builds NeMo's VAE and text encoder.
    with pytest.raises(ConfigError) as error:
        launch(
            compose_config([f"cluster.shared_dir={tmp_path}", "data_preparation.precache.enable=true"]),
            no_venv,
        )
    assert error.value.key == "training.run.python"
    assert "to run encode_latents with" in str(error.value)
    assert "data_preparation.precache.python for one" in str(error.value)
    assert list(tmp_path.iterdir()) == []
    # The default command (data preparation alone) needs no NeMo.
    launch(compose_config([f"cluster.shared_dir={tmp_path}", "dry_run=true"]), no_venv)
    assert (tmp_path / "results/sd_860m_res_256/data_preparation/download_images.sbatch").exists()


# The cached-latents switch (data_preparation.precache, on in the aws presets): refused naming the keys.
AUG = "training.model.data.train.augmentations"
LATENT_CASES = [
    # (overrides, the key the error starts with, words it must contain)
    (
        ["stages=[data_preparation]", "training.model.first_stage_config.from_pretrained=null"],
        "training.model.first_stage_config.from_pretrained",
        "random VAE",
    ),
    (
        [
            f"{AUG}.resize_smallest_side=512",
            f"{AUG}.center_crop_h_w='512, 512'",
            "training.model.unet_config.image_size=64",
            # PD12M's image_size follows the preset's resolution unless set otherwise, as here.
            "data_preparation.download_images.image_size=256",
        ],
        f"{AUG}.resize_smallest_side",
        "data_preparation.download_images.image_size is 256",
    ),
    (
        ["training.model.unet_config.image_size=64"],
        "training.model.unet_config.image_size",
        "are 32x32",
    ),
    (
        ["training.model.unet_config.in_channels=8"],
        "training.model.unet_config.in_channels",
        "embed_dim",
    ),
    ([f"{AUG}.horizontal_flip=true"], f"{AUG}.horizontal_flip", "freeze one draw"),
    (
        ["data_preparation.precache.enable=false", "training.model.first_stage_key=image_encoded"],
        "training.model.first_stage_key",
        "data_preparation.precache.enable is false",
    ),
    (
        ["training.model.cond_stage_key=captions_clip_encoded"],
        "training.model.cond_stage_key",
        "captions_encoded",
    ),
]


@pytest.mark.parametrize(("overrides", "key", "words"), LATENT_CASES, ids=[case[1] for case in LATENT_CASES])
def test_bad_latent_settings_are_refused_before_anything_is_submitted(
    overrides: list[str],
    key: str,
    words: str,
    tmp_path: Path,
    recording_sbatch: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert words in _refused(overrides, key, tmp_path, recording_sbatch, capsys)
