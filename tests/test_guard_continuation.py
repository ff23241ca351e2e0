"""Continuations say so: a preset that continues another (training.continues, data in its YAML) is refused
without training.init_from, naming the key, the preset it continues, where that run trains by default and
`training.init_from=none`, the explicit start from random weights."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from conftest import FIXED_FACTS, REPO

from launcher import nemo_config
from launcher.cli import main
from launcher.context import Context
from launcher.errors import ConfigError
from launcher.pipeline import build_plan

PRESETS = REPO / "conf/training"
# (SDXL reads the image tars: the slurm preset's SD latents switch is off.)
GPU = [
    "cluster=slurm",
    "cluster.gpus_per_node=8",
    "data_check.enable=false",
    "stages=[training]",
    "data_preparation.precache.enable=false",
]
# NVIDIA's curricula: each stage after the first, the stage whose UNet it continues, and that stage's
# run folder; SDXL's 1024 px stage continues the 512 px one (NVIDIA's file names stage 1's checkpoint).
CONTINUES = {
    "stable_diffusion/860m_res_512_v1_1": ("stable_diffusion/860m_res_256_pretrain", "sd_860m_res_256"),
    "stable_diffusion/860m_res_512_v1_2": ("stable_diffusion/860m_res_512_v1_1", "sd_860m_res_512_v1_1"),
    "stable_diffusion/860m_res_512_v1_5": ("stable_diffusion/860m_res_512_v1_2", "sd_860m_res_512_v1_2"),
    "stable_diffusion/860m_res_512_v2_0_base": (
        "stable_diffusion/860m_res_256_v2_0_pretrain",
        "sd_860m_res_256_v2_0_pretrain",
    ),
    "sdxl/sdxl_base_train_res_512_stage_2": (
        "sdxl/sdxl_base_train_res_256_stage_1",
        "sdxl_base_train_res_256_stage_1",
    ),
    "sdxl/sdxl_base_train_res_1024_stage_3": (
        "sdxl/sdxl_base_train_res_512_stage_2",
        "sdxl_base_train_res_512_stage_2",
    ),
}


@pytest.mark.parametrize("preset", sorted(CONTINUES))
def test_a_continuation_without_init_from_is_refused_naming_what_it_continues(
    make_config: Callable, tmp_path: Path, preset: str
) -> None:
    continued, run = CONTINUES[preset]
    with pytest.raises(ConfigError) as refused:
        make_config(*GPU, f"training={preset}")
    message = str(refused.value)
    assert refused.value.key == "training.init_from"
    name = yaml.safe_load((PRESETS / f"{preset}.yaml").read_text())["run"]["name"]
    assert f"{name} continues {continued} (training.continues)" in message
    assert f"by default {tmp_path}/results/{run})" in message
    assert "training.init_from=none to start from random weights on purpose" in message


def test_every_preset_that_continues_one_says_so_in_its_own_file() -> None:
    """The relation is data in the preset files (inherited by none: each continuation names its own)."""
    said = {}
    for path in sorted(PRESETS.rglob("*.yaml")):
        continues = yaml.safe_load(path.read_text()).get("continues")
        if continues:
            said[str(path.relative_to(PRESETS).with_suffix(""))] = continues
    assert said == {preset: was for preset, (was, _) in CONTINUES.items()}


@pytest.mark.parametrize(
    "preset",
    [
        "stable_diffusion/860m_res_256_pretrain",
        "stable_diffusion/860m_res_256_1node",
        "stable_diffusion/860m_res_256_v2_0_pretrain",
        "sdxl/sdxl_base_train_res_256_stage_1",
    ],
)
def test_a_preset_from_scratch_needs_no_init_from(make_config: Callable, preset: str) -> None:
    cfg = make_config(*GPU, f"training={preset}")
    assert cfg.training.continues is None and cfg.training.init_from is None


def test_init_from_none_trains_from_random_weights_on_purpose(make_config: Callable) -> None:
    cfg = make_config(*GPU, "training=stable_diffusion/860m_res_512_v1_1", "training.init_from=none")
    plan = build_plan(cfg, FIXED_FACTS)
    assert [job.name for job in plan.jobs if job.stage == "training"] == [
        "sd_860m_res_512_v1_1"
    ]  # no init job
    unet = nemo_config.build(Context(cfg, FIXED_FACTS, plan.run_dir))["model"]["unet_config"]
    assert unet["from_pretrained"] is None
    assert "training: the UNet starts from random weights (training.init_from=none)" in plan.notes


def test_nemo_s_own_from_pretrained_names_the_start_too(make_config: Callable) -> None:
    cfg = make_config(
        *GPU,
        "training=stable_diffusion/860m_res_512_v1_1",
        "training.model.unet_config.from_pretrained=/x/u.ckpt",
    )
    assert cfg.training.init_from is None


def test_preparing_a_continuation_s_data_needs_no_init_from(make_config: Callable) -> None:
    cfg = make_config(
        "cluster=slurm", "stages=[data_preparation]", "training=stable_diffusion/860m_res_512_v1_1"
    )
    assert cfg.data_dir.endswith("/data_512_min1024")


@pytest.mark.parametrize(
    ("override", "key", "allowed"),
    [
        ("training.init_from=nonee", "training.init_from", "or none: random weights on purpose"),
        ("training.init_from=relative/run", "training.init_from", "an absolute path"),
        (
            "training.continues=stable_diffusion/nope",
            "training.continues",
            "stable_diffusion/860m_res_512_v1_1",
        ),
    ],
)
def test_bad_values_name_their_key_and_what_is_allowed(
    make_config: Callable, override: str, key: str, allowed: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        make_config(*GPU, "training=stable_diffusion/860m_res_512_v1_1", override)
    assert refused.value.key == key and allowed in str(refused.value), str(refused.value)


def test_the_command_line_gets_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    argv = [f"cluster.shared_dir={tmp_path}", *GPU, "training=stable_diffusion/860m_res_512_v2_0_base"]
    assert main([*argv, "dry_run=true"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "error: training.init_from: not set, but sd_860m_res_512_v2_0_base"
    )
    assert not (tmp_path / "results").exists()
