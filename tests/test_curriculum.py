"""The curriculum presets: each one's data folder, PD12M filters, cached-sample shapes and text encoder."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import compose_config

from data_prep import latent_format as fmt
from launcher.cli import launch
from launcher.errors import ConfigError
from launcher.validate import to_schema

# preset -> (data folder, side, min larger side, text embedding shape)
PRESETS = {
    "860m_res_256_pretrain": ("data", 256, None, (80, 768)),
    "860m_res_512_v1_1": ("data_512_min1024", 512, 1024, (80, 768)),
    "860m_res_512_v1_2": ("data_512", 512, 512, (80, 768)),
    "860m_res_512_v1_5": ("data_512", 512, 512, (80, 768)),
    "860m_res_256_v2_0_pretrain": ("data_sd2_256", 256, None, (77, 1024)),
    "860m_res_512_v2_0_base": ("data_sd2_512", 512, 512, (77, 1024)),
}


def _cfg(preset: str, *overrides: str):
    base = ["cluster=aws_p5", "cluster.shared_dir=/fsx", f"training=stable_diffusion/{preset}"]
    return to_schema(compose_config([*base, *overrides]))


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_each_preset_prepares_its_own_data_at_its_resolution(preset: str) -> None:
    folder, side, larger, text = PRESETS[preset]
    cfg = _cfg(preset)
    assert cfg.data_dir == f"/fsx/{folder}"
    assert cfg.training.run.name == (
        "sd_860m_res_256" if preset == "860m_res_256_pretrain" else f"sd_{preset}"
    )
    dp = cfg.data_preparation
    assert (
        dp.download_images.image_size
        == dp.download_parquet.min_width
        == dp.download_parquet.min_height
        == side
    )
    assert dp.download_parquet.min_larger_side == larger
    assert fmt.sample_shapes(cfg.training.model) == ((8, side // 8, side // 8), text)


def test_an_openclip_hub_name_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    overrides = [
        f"cluster.shared_dir={tmp_path}",
        f"container.mounts=[{tmp_path}:{tmp_path}]",
        "dry_run=true",
    ]
    bad = "training.model.cond_stage_config.version=laion2b_s32b_b79k"
    with pytest.raises(
        ConfigError, match=r"training.model.cond_stage_config.version.*open_clip_pytorch_model.bin"
    ):
        launch(
            compose_config(
                [
                    "cluster=aws_p5",
                    "training=stable_diffusion/860m_res_256_v2_0_pretrain",
                    "stages=[training]",
                    bad,
                    *overrides,
                ]
            )
        )
    assert not (tmp_path / "results").exists()
