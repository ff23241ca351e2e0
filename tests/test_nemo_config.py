"""The NeMo config the training stage saves: derived values, refusals, and the training script around it.

Whether NeMo accepts the config is judged by NeMo itself in test_nemo_training.py."""

from __future__ import annotations

import pickle
import subprocess
from pathlib import Path

import pytest
from conftest import compose_config
from fixtures.tools import shellcheck_exe
from omegaconf import OmegaConf

from data_prep import latent_check
from data_prep.family_settings import named, read_settings
from data_prep.latent_encoder import LatentEncoder
from launcher.cli import launch
from launcher.errors import ConfigError, LauncherError
from launcher.nemo_version import CPU_NEMO_VERSION, NEMO_CONTAINER
from launcher.plugins.sdxl import text_cache


def _saved(tmp_path: Path, *extra: str, name: str | None = None) -> tuple[Path, object]:
    stages = [] if any(e.startswith("stages=") for e in extra) else ["stages=[data_preparation,training]"]
    launch(
        compose_config(
            [
                "cluster=aws_p5",
                *stages,
                "dry_run=true",
                "training.trainer.num_nodes=2",
                f"cluster.shared_dir={tmp_path}",
                f"container.mounts=[{tmp_path}:{tmp_path}]",
                *extra,
            ]
        )
    )
    name = name or (
        "sd_860m_res_256_synthetic" if any("synthetic" in e for e in extra) else "sd_860m_res_256"
    )
    path = tmp_path / f"results/{name}/training/{name}.yaml"
    return path, OmegaConf.load(path)


def test_derived_values_point_at_what_data_preparation_writes(tmp_path: Path) -> None:
    _, images = _saved(tmp_path / "images", "data_preparation.precache.enable=false")
    tars = tmp_path / "images/data/tarfiles_reorganized"
    assert images.model.data.train.dataset_path == [str(tars / "wdinfo.pkl")]
    assert images.model.data.webdataset.local_root_path == str(tars)
    assert (images.model.first_stage_key, images.model.cond_stage_key) == ("images", "captions")
    # The aws preset's default: cached latents, NeMo's precached keys (docs: image_encoded/captions_encoded).
    _, cfg = _saved(tmp_path)
    latents = tmp_path / "data/tarfiles_latents"
    assert cfg.model.data.train.dataset_path == [str(latents / "wdinfo.pkl")]
    assert cfg.model.data.webdataset.local_root_path == str(latents)
    assert (cfg.model.first_stage_key, cfg.model.cond_stage_key) == ("image_encoded", "captions_encoded")
    tars = tmp_path / "data/tarfiles_reorganized"
    assert (cfg.trainer.devices, cfg.trainer.num_nodes) == (8, 2)
    assert cfg.exp_manager.explicit_log_dir == str(tmp_path / "results/sd_860m_res_256/training/results")
    assert cfg.trainer.accumulate_grad_batches == 1
    assert cfg.model.optim.lr == 8.192e-5  # sd_train.yaml leaves it null: it must be set
    reorganize = (tmp_path / "results/sd_860m_res_256/data_preparation/reorganize_tar.sbatch").read_text()
    assert f"--output-dir {tars}" in reorganize


def test_beside_each_config_its_familys_answers_for_the_data_programs(tmp_path: Path) -> None:
    """data_check and encode_latents read them (data_prep imports nothing of the launcher): the dataset
    builder the config takes, its batch keys, the keys the loader needs, the cache's encoder."""
    images, _ = _saved(tmp_path / "images", "data_preparation.precache.enable=false")
    off, on = read_settings(images), read_settings(_saved(tmp_path)[0])
    assert (off.builder, off.reads_cache, off.batch_keys) == (
        "build_train_valid_datasets",
        False,
        ("images", "captions"),
    )
    assert (on.builder, on.reads_cache, on.batch_keys) == (
        "build_train_valid_precached_datasets",
        True,
        ("image_encoded", "captions_encoded"),
    )
    assert (on.model_keys, on.text_encoders) == (
        ("first_stage_key", "cond_stage_key"),
        ("cond_stage_config",),
    )
    # The cache's encoder and check, found by the names the settings carry (as the jobs find them).
    assert (named(on.encoder), named(on.batch_check)) == (LatentEncoder, latent_check.loader_errors)
    # SDXL's encode step reads training's config before the switch: its caption embedders, the image tars.
    name = "sdxl_base_train_res_256_stage_1"
    config, _ = _saved(
        tmp_path / "sdxl", f"training=sdxl/{name}", "data_preparation.precache.enable=true", name=name
    )
    switched, encode = read_settings(config), read_settings(config.with_name(f"{name}_encode.yaml"))
    assert (named(switched.encoder), switched.batch_check) == (text_cache.TextEncoder, None)
    assert (switched.reads_cache, switched.text_encoders) == (True, ())
    assert (encode.builder, encode.reads_cache, encode.model_keys) == (
        "build_sdxl_train_valid_datasets",
        False,
        (),
    )
    assert encode.text_encoders == tuple(f"conditioner_config.emb_models.{i}.emb_model" for i in (0, 1))


def test_two_node_aws_p5_dry_run_has_what_nemo_and_slurm_need(tmp_path: Path) -> None:
    _, cfg = _saved(tmp_path, "training.run.chain=2")
    run = tmp_path / "results/sd_860m_res_256"
    assert cfg.model.first_stage_config.from_pretrained == str(
        tmp_path / "models/sd-vae-ft-mse/diffusion_pytorch_model.safetensors"
    )
    assert cfg.model.cond_stage_config.version == str(tmp_path / "models/clip-vit-large-patch14")
    assert cfg.exp_manager.max_time_per_run == "01:23:40:00"  # 48 h less training.run.stop_before_limit_s
    parts = [(run / f"training/sd_860m_res_256_part{k}.sbatch").read_text() for k in (0, 1)]
    for script in parts:
        assert "#SBATCH --job-name=sd_860m_res_256\n" in script  # one name: singleton links the parts
        assert "#SBATCH --time=48:00:00" in script and "--signal" not in script
        # One ft_launcher task per node (in-job recovery) with all the node's CPUs for its 8 ranks.
        for line in ("export HF_HUB_OFFLINE=1", "export FI_EFA_FORK_SAFE=1", "  --cpus-per-task=192 \\"):
            assert line in script
        assert "PYTHONPATH" not in script  # the image's own PYTHONPATH stays
    assert "singleton" in parts[1] and "afterany:" in parts[1]
    shellcheck = subprocess.run(
        [shellcheck_exe(), *map(str, run.rglob("*.sbatch"))], capture_output=True, text=True
    )
    assert shellcheck.returncode == 0, shellcheck.stdout


@pytest.mark.parametrize(
    ("override", "key"),
    [
        (
            "training.model.first_stage_config.from_pretrained=null",
            "training.model.first_stage_config.from_pretrained",
        ),
        (
            "training.model.cond_stage_config.version=openai/clip-vit-large-patch14",
            "training.model.cond_stage_config.version",
        ),
        ("training.run.stop_before_limit_s=200000", "training.run.stop_before_limit_s"),
        ("cluster.time_limit=forever", "cluster.time_limit"),
        # A resumed run would draw its first samples again (issue 37.4): NeMo reads the position from the name.
        (
            "training.exp_manager.checkpoint_callback_params.filename='sd--{step}'",
            "training.exp_manager.checkpoint_callback_params.filename",
        ),
        (
            "training.exp_manager.checkpoint_callback_params.filename='sd--{step}-{consumed_samples:.0f}'",
            "training.exp_manager.checkpoint_callback_params.filename",
        ),
    ],
)
def test_training_inputs_refused_before_anything_is_written(tmp_path: Path, override: str, key: str) -> None:
    with pytest.raises(ConfigError) as refused:
        _saved(tmp_path, override)
    assert refused.value.key == key
    assert not (tmp_path / "results").exists()


def test_a_checkpoint_name_without_the_data_position_is_allowed_where_nemo_keeps_none(tmp_path: Path) -> None:
    """With infinite_sampler NeMo draws shards at random and reads no position back: any name will do."""
    _, cfg = _saved(
        tmp_path,
        "training.exp_manager.checkpoint_callback_params.filename='sd--{step}'",
        "training.model.data.webdataset.infinite_sampler=true",
    )
    assert cfg.exp_manager.checkpoint_callback_params.filename == "sd--{step}"


def test_synthetic_data_may_train_without_a_vae(tmp_path: Path) -> None:
    _, cfg = _saved(
        tmp_path,
        "training=stable_diffusion/860m_res_256_synthetic",
        "stages=[training]",  # nothing to prepare: data_preparation is refused beside synthetic data
        "training.trainer.num_nodes=1",
        "training.model.first_stage_config.from_pretrained=null",
        "data_check.enable=false",
    )
    assert cfg.model.first_stage_config.from_pretrained is None


def test_one_nemo_version_for_presets_container_and_cpu_checks() -> None:
    repo = Path(__file__).resolve().parents[1]
    assert f"ARG NEMO_IMAGE={NEMO_CONTAINER}\n" in (repo / "Dockerfile").read_text()
    assert (
        f"nemo_toolkit[core,common-only]=={CPU_NEMO_VERSION}\n"
        in (repo / "requirements-nemo.txt").read_text()
    )


def _training_only(tmp_path: Path, tars: int, *extra: str) -> None:
    wdinfo = tmp_path / "data/tarfiles_latents/wdinfo.pkl"  # aws_p5 trains from cached latents
    wdinfo.parent.mkdir(parents=True, exist_ok=True)
    wdinfo.write_bytes(
        pickle.dumps(
            {
                "tar_files": [f"{i:06d}.tar" for i in range(tars)],
                "chunk_size": 1000,
                "total_key_count": tars * 1000,
            }
        )
    )
    (tmp_path / "nemo.sqsh").write_bytes(b"hsqs")
    launch(
        compose_config(
            [
                "cluster=aws_p5",
                "stages=[training]",
                "training.trainer.num_nodes=2",
                f"cluster.shared_dir={tmp_path}",
                f"container.mounts=[{tmp_path}:{tmp_path}]",
                f"container.image={tmp_path}/nemo.sqsh",
                *extra,
            ]
        )
    )


def test_preflight_refuses_fewer_tars_than_ranks(tmp_path: Path) -> None:
    with pytest.raises(LauncherError, match="lists 15 tars but training has 16 ranks"):
        _training_only(tmp_path, 15)
    assert not (tmp_path / "results").exists()


def test_preflight_refuses_a_missing_image(tmp_path: Path) -> None:
    with pytest.raises(LauncherError, match=r"container\.image: /nowhere/x\.sqsh does not exist"):
        _training_only(tmp_path, 40, "container.image=/nowhere/x.sqsh")


def test_preflight_reports_the_shard_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _training_only(tmp_path, 40, "dry_run=true")
    out = capsys.readouterr().out
    assert "40 tars for 16 ranks: 2 tars per rank, 8 left out of every epoch" in out
    assert "14 of 16 workers per rank idle" in out


@pytest.mark.parametrize(
    ("files", "done"),
    [
        ((), False),
        # NeMo marks a checkpoint being written with <name less .ckpt and -EMA>-unfinished.
        (
            ("sd--step=82500-consumed_samples=1.0.ckpt", "sd--step=82500-consumed_samples=1.0-unfinished"),
            False,
        ),
        (
            (
                "sd--step=82500-consumed_samples=1.0-EMA.ckpt",
                "sd--step=82500-consumed_samples=1.0-unfinished",
            ),
            False,
        ),
        (("sd--step=8250-consumed_samples=1.0.ckpt",), False),
        (("sd--step=82500-consumed_samples=1.0.ckpt",), True),
        (("sd--step=82500-consumed_samples=1.0-last.ckpt", "sd--step=82500-consumed_samples=1.0.ckpt"), True),
    ],
)
def test_chained_job_is_done_only_at_a_finished_max_steps_checkpoint(
    tmp_path: Path, files: tuple[str, ...], done: bool
) -> None:
    _saved(tmp_path)
    script = (tmp_path / "results/sd_860m_res_256/training/sd_860m_res_256.sbatch").read_text()
    prologue = script[script.index("for checkpoint in") : script.index("\ndone\n") + 6]
    checkpoints = tmp_path / "results/sd_860m_res_256/training/results/checkpoints"
    checkpoints.mkdir(parents=True)
    for name in files:
        (checkpoints / name).write_text("")
    ran = subprocess.run(
        ["bash", "-c", prologue + "echo TRAINING WOULD START"], capture_output=True, text=True
    )
    assert ran.returncode == 0
    assert ("already reached" in ran.stdout) is done
    assert ("TRAINING WOULD START" in ran.stdout) is not done
