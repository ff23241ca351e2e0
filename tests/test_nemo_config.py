"""The NeMo config the training stage saves: derived values and the keys NeMo's sd_train.py reads."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from conftest import compose_config
from omegaconf import OmegaConf

from launcher.errors import LauncherError
from launcher.main import launch

# Every key of NeMo's examples/.../stable_diffusion/conf/sd_train.yaml (NeMo 2.4), read from
# NeMo's public source; the cond_stage_config keys differ by embedder and are checked apart.
NEMO_KEYS = """
name trainer.devices trainer.num_nodes trainer.accelerator trainer.precision trainer.logger
trainer.enable_checkpointing trainer.use_distributed_sampler trainer.max_epochs trainer.max_steps
trainer.log_every_n_steps trainer.accumulate_grad_batches trainer.gradient_clip_val trainer.benchmark
trainer.enable_model_summary trainer.limit_val_batches exp_manager.exp_dir exp_manager.name
exp_manager.create_wandb_logger exp_manager.wandb_logger_kwargs exp_manager.create_checkpoint_callback
exp_manager.create_tensorboard_logger exp_manager.checkpoint_callback_params.every_n_train_steps
exp_manager.checkpoint_callback_params.monitor exp_manager.checkpoint_callback_params.filename
exp_manager.resume_if_exists exp_manager.resume_ignore_no_checkpoint exp_manager.resume_from_checkpoint
exp_manager.ema.enable exp_manager.ema.decay model.precision model.micro_batch_size model.global_batch_size
model.native_amp_init_scale model.linear_start model.linear_end model.num_timesteps_cond model.log_every_t
model.timesteps model.first_stage_key model.cond_stage_key model.image_size model.channels
model.cond_stage_trainable model.conditioning_key model.monitor model.scale_factor model.use_ema
model.scale_by_std model.ckpt_path model.ignore_keys model.parameterization model.clip_denoised
model.load_only_unet model.cosine_s model.given_betas model.original_elbo_weight model.v_posterior
model.l_simple_weight model.use_positional_encodings model.learn_logvar model.logvar_init
model.beta_schedule model.loss_type model.concat_mode model.cond_stage_forward
model.text_embedding_dropout_rate model.fused_opt model.inductor model.inductor_cudagraphs
model.capture_cudagraph_iters model.channels_last model.unet_config._target_ model.unet_config.from_pretrained
model.unet_config.from_NeMo model.unet_config.model_channels model.unet_config.attention_resolutions
model.unet_config.num_res_blocks model.unet_config.channel_mult model.unet_config.num_heads
model.unet_config.use_spatial_transformer model.unet_config.transformer_depth model.unet_config.context_dim
model.unet_config.use_checkpoint model.unet_config.legacy model.unet_config.use_flash_attention
model.unet_config.enable_amp_o2_fp16 model.unet_config.resblock_gn_groups model.unet_config.use_te_fp8
model.first_stage_config._target_ model.first_stage_config.from_pretrained model.first_stage_config.embed_dim
model.first_stage_config.ddconfig model.first_stage_config.lossconfig model.seed model.resume_from_checkpoint
model.apex_transformer_log_level model.gradient_as_bucket_view model.ddp_overlap model.optim.name
model.optim.lr model.optim.weight_decay model.optim.betas model.optim.sched.name
model.optim.sched.warmup_steps model.optim.sched.hold_steps model.nsys_profile.enabled model.data.num_workers
model.data.synthetic_data model.data.synthetic_data_length model.data.train.dataset_path
model.data.train.augmentations model.data.train.filterings model.data.webdataset.infinite_sampler
model.data.webdataset.local_root_path
""".split()


def _saved(tmp_path: Path) -> tuple[Path, object]:
    launch(compose_config([
        "cluster=aws_p5", "stages=[data_preparation,training]", "dry_run=true", "training.trainer.num_nodes=2",
        f"cluster.shared_dir={tmp_path}", f"container.mounts=[{tmp_path}:{tmp_path}]",
    ]))  # fmt: skip
    path = tmp_path / "results/sd_pretrain/training/sd_860m_res_256.yaml"
    return path, OmegaConf.load(path)


def test_derived_values_point_at_what_data_preparation_writes(tmp_path: Path) -> None:
    _, cfg = _saved(tmp_path)
    tars = tmp_path / "data/tarfiles_reorganized"
    assert cfg.model.data.train.dataset_path == [str(tars / "wdinfo.pkl")]
    assert cfg.model.data.webdataset.local_root_path == str(tars)
    assert (cfg.trainer.devices, cfg.trainer.num_nodes) == (8, 2)
    assert cfg.exp_manager.explicit_log_dir == str(tmp_path / "results/sd_pretrain/training/results")
    assert cfg.trainer.accumulate_grad_batches == 1
    assert cfg.model.optim.lr == 8.192e-5  # sd_train.yaml leaves it null: it must be set
    reorganize = (tmp_path / "results/sd_pretrain/data_preparation/reorganize_tar.sbatch").read_text()
    assert f"--output-dir {tars}" in reorganize


def test_every_key_nemo_reads_is_set(tmp_path: Path) -> None:
    _, cfg = _saved(tmp_path)
    missing = [key for key in NEMO_KEYS if OmegaConf.select(cfg, key, default="<missing>") == "<missing>"]
    assert missing == []
    assert list(cfg.model.data.train.augmentations) == ["resize_smallest_side", "center_crop_h_w", "horizontal_flip"]
    assert cfg.model.cond_stage_config.version == "openai/clip-vit-large-patch14"


def _training_only(tmp_path: Path, tars: int, *extra: str) -> None:
    wdinfo = tmp_path / "data/tarfiles_reorganized/wdinfo.pkl"
    wdinfo.parent.mkdir(parents=True, exist_ok=True)
    wdinfo.write_bytes(pickle.dumps({"tar_files": [f"{i:06d}.tar" for i in range(tars)], "chunk_size": 1000,
                                     "total_key_count": tars * 1000}))  # fmt: skip
    (tmp_path / "nemo.sqsh").write_bytes(b"hsqs")
    launch(compose_config([
        "cluster=aws_p5", "stages=[training]", "training.trainer.num_nodes=2", f"cluster.shared_dir={tmp_path}",
        f"container.mounts=[{tmp_path}:{tmp_path}]", f"container.image={tmp_path}/nemo.sqsh", *extra,
    ]))  # fmt: skip


def test_preflight_refuses_fewer_tars_than_ranks(tmp_path: Path) -> None:
    with pytest.raises(LauncherError, match="lists 15 tars but training has 16 ranks"):
        _training_only(tmp_path, 15)
    assert not (tmp_path / "results").exists()


def test_preflight_refuses_a_missing_image(tmp_path: Path) -> None:
    with pytest.raises(LauncherError, match="container.image: /nowhere/x.sqsh does not exist"):
        _training_only(tmp_path, 40, "container.image=/nowhere/x.sqsh")


def test_preflight_reports_the_shard_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _training_only(tmp_path, 40, "dry_run=true")
    out = capsys.readouterr().out
    assert "40 tars for 16 ranks: 2 tars per rank, 8 left out of every epoch" in out
    assert "14 of 16 workers per rank idle" in out
