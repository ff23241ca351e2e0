"""The SDXL presets (conf/training/sdxl/) compose with NVIDIA's values, and what NeMo's SDXL training cannot
run is refused before anything is written, naming the key (launcher/plugins/sdxl/checks.py, launcher/nemo_config.py,
launcher/latents.py). NeMo's own code runs these presets in tests/test_nemo_sdxl.py."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from launcher.errors import ConfigError
from launcher.families import family_of
from launcher.plugins.sdxl import checks as sdxl_checks
from launcher.sampling.resolution import trained_size

IMAGES = "data_preparation.precache.enable=false"  # the GPU presets' latents are SD's: SDXL reads images
GPU = ["cluster=slurm", "cluster.gpus_per_node=8", "data_check.enable=false", "stages=[training]", IMAGES]
STAGE_1 = "training=sdxl/sdxl_base_train_res_256_stage_1"
CONDITIONER = "training.model.conditioner_config.emb_models"
# preset -> (nodes, micro batch, global batch, max_steps, resolution, data folder, continues)
NVIDIA = {
    "sdxl_base_train_res_256_stage_1": (4, 64, 2048, 600000, 256, "data_sdxl_256", None),
    "sdxl_base_train_res_512_stage_2": (16, 16, 2048, 200000, 512, "data_sdxl_512", "res_256_stage_1"),
    # 8 nodes and 100,000 steps: the preset's header says why (NVIDIA: 16 nodes, -1)
    "sdxl_base_train_res_1024_stage_3": (8, 4, 256, 100000, 1024, "data_sdxl_1024", "res_512_stage_2"),
}


@pytest.mark.parametrize("preset", sorted(NVIDIA))
def test_each_preset_composes_with_nvidias_values(make_config: Callable, tmp_path: Path, preset: str) -> None:
    nodes, micro, batch, steps, side, folder, continues = NVIDIA[preset]
    start = ["training.init_from=none"] if continues else []
    cfg = make_config(*GPU, f"training=sdxl/{preset}", *start)
    tr, model = cfg.training, cfg.training.model
    assert (tr.run.name, cfg.data_dir) == (preset, f"{tmp_path}/{folder}")
    assert tr.continues == (f"sdxl/sdxl_base_train_{continues}" if continues else None)
    assert (tr.trainer["num_nodes"], tr.trainer["max_steps"]) == (nodes, steps)
    assert (model["micro_batch_size"], model["global_batch_size"]) == (micro, batch)
    assert tr.run.script.endswith("/stable_diffusion/sd_xl_train.py")
    assert family_of(model).name == "sdxl" and model["fsdp"] and model["optim"]["lr"] == 2.048e-5
    assert trained_size(model) == (side, side)
    assert cfg.data_preparation.download_images.image_size == side
    unet = model["unet_config"]
    assert (unet["context_dim"], unet["adm_in_channels"], unet["transformer_depth"]) == (
        2048,
        2816,
        [1, 2, 10],
    )
    versions = [encoder["version"] for _, encoder in family_of(model).text_encoders(model)]
    assert versions == [
        cfg.assets.text_encoder.local_dir,
        f"{cfg.assets.open_clip_bigg.local_dir}/open_clip_pytorch_model.bin",
    ]
    assert model["first_stage_config"]["from_pretrained"].startswith(cfg.assets.sdxl_vae.local_dir + "/")


def test_the_text_encoders_device_is_settable(make_config: Callable) -> None:
    cfg = make_config(*GPU, STAGE_1, f"{CONDITIONER}.0.emb_model.device=cpu")
    model = cfg.training.model
    assert [encoder["device"] for _, encoder in family_of(model).text_encoders(model)] == ["cpu", "cuda"]


def _refused(make_config: Callable, *overrides: str) -> ConfigError:
    with pytest.raises(ConfigError) as refused:
        make_config(*GPU, STAGE_1, *overrides)
    return refused.value


@pytest.mark.parametrize(
    ("override", "key", "says"),
    [
        (
            "+training.model.data.train.augmentations.center_crop_h_w='256, 256'",
            "training.model.data.train.augmentations.center_crop_h_w",
            "size embedders fail with a KeyError",
        ),
        ("training.model.precache_mode=both", "training.model.precache_mode", "Allowed: null"),
        (
            "+training.model.data.synthetic_data=true",
            "training.model.data.synthetic_data",
            "benchmark.synthetic_data=false",
        ),
        (
            "training.model.unet_config.context_dim=1024",
            "training.model.unet_config.context_dim",
            "768 + 1280 = 2048",
        ),
        (
            "training.model.unet_config.adm_in_channels=1280",
            "training.model.unet_config.adm_in_channels",
            "1280 + 512 + 512 + 512 = 2816",
        ),
        (
            f"{CONDITIONER}.1.emb_model.arch=ViT-H-14",  # the SD 2.0 arch: 1024 wide
            "training.model.unet_config.context_dim",
            "768 + 1024 = 1792",
        ),
        (
            f"{CONDITIONER}.1.emb_model.version=laion2b_s39b_b160k",  # NVIDIA's: open_clip's download
            f"{CONDITIONER}.1.emb_model.version",
            "${assets.open_clip_bigg.local_dir}/open_clip_pytorch_model.bin",
        ),
        (
            f"~{CONDITIONER}.0.emb_model.version",  # NVIDIA's: NeMo's default, the Hub's CLIP
            f"{CONDITIONER}.0.emb_model.version",
            "unset (NeMo's default, a download)",
        ),
        (
            "training.model.first_stage_config.from_pretrained=null",
            "training.model.first_stage_config.from_pretrained",
            "${assets.sdxl_vae.local_dir}/diffusion_pytorch_model.safetensors",
        ),
    ],
)
def test_what_nemos_sdxl_training_cannot_run_is_refused_naming_the_key(
    make_config: Callable, override: str, key: str, says: str
) -> None:
    error = _refused(make_config, override)
    assert error.key == key and says in str(error)


def test_no_resize_smallest_side_is_refused(make_config: Callable) -> None:
    """(On the command line its null is refused first: data preparation's image size follows it.)"""
    cfg = make_config(*GPU, STAGE_1)
    model = copy.deepcopy(cfg.training.model)
    del model["data"]["train"]["augmentations"]["resize_smallest_side"]
    with pytest.raises(ConfigError, match="the training resolution in px") as refused:
        sdxl_checks.check(dataclasses.replace(cfg, training=dataclasses.replace(cfg.training, model=model)))
    assert refused.value.key == "training.model.data.train.augmentations.resize_smallest_side"


def test_a_width_the_config_does_not_name_is_left_to_nemo(make_config: Callable) -> None:
    """An open_clip arch outside the table (the tests' tiny one): no width to compare, nothing refused."""
    cfg = make_config(*GPU, STAGE_1, f"{CONDITIONER}.1.emb_model.arch=ViT-S-32-alt")
    assert cfg.training.model["unet_config"]["context_dim"] == 2048
