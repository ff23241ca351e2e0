"""One training per run folder: a launch of training records it in the run folder, a launch of another
training into that folder is refused naming run_name, the training there and what to do, and the same
training launched again passes (max_steps may be raised). run_name defaults to the training preset's name.

The same on the real test cluster, with the resume: tests/test_guard_slurm.py.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from conftest import FIXED_FACTS, compose_config

from launcher.cli import launch
from launcher.errors import ConfigError
from launcher.outputs import TrainingOutputs
from launcher.stages import training_record
from launcher.validate import check_facts, to_schema

GPU = ["cluster=slurm", "cluster.gpus_per_node=8", "data_check.enable=false", "stages=[training]"]
IMAGES = "data_preparation.precache.enable=false"  # (a crop of another size than the latents')
CURRICULUM = [
    "860m_res_256_pretrain",
    "860m_res_512_v1_1",
    "860m_res_512_v1_2",
    "860m_res_512_v1_5",
    "860m_res_256_v2_0_pretrain",
    "860m_res_512_v2_0_base",
]
CKPT = "stable-diffusion--reduced_train_loss=0.10-step={step}-consumed_samples={step}.0.ckpt"


def test_run_name_is_the_training_preset_s_name_so_the_curriculum_never_shares_a_folder(
    make_config: Callable,
) -> None:
    names = {}
    for preset in CURRICULUM:
        cfg = make_config("cluster=slurm", f"training=stable_diffusion/{preset}", "stages=[data_preparation]")
        assert cfg.run_name == cfg.training.run.name
        names[preset] = cfg.run_name
    assert names["860m_res_256_pretrain"] == "sd_860m_res_256" and len(set(names.values())) == len(CURRICULUM)
    assert make_config("run_name=mine").run_name == "mine"


@pytest.fixture
def launched(make_config: Callable) -> Path:
    """A run folder `shared` where the 256 px preset was launched (its record, as a launch writes it)."""
    cfg = make_config(*GPU, "run_name=shared")
    training_record.write(cfg)
    return Path(cfg.base_results_dir) / "shared"


def test_another_preset_is_refused_naming_run_name_what_is_there_and_what_to_do(
    make_config: Callable, launched: Path
) -> None:
    cfg = make_config(
        *GPU,
        "run_name=shared",
        "training=stable_diffusion/860m_res_512_v1_1",
        f"training.init_from={launched}",
    )
    with pytest.raises(ConfigError) as refused:
        check_facts(cfg, FIXED_FACTS)
    assert refused.value.key == "run_name"
    assert str(refused.value) == (
        f"run_name: {launched} holds the training sd_860m_res_256 (256x256 px, max_steps 82500); this launch "
        "is sd_860m_res_512_v1_1 (512x512 px, max_steps 50000). Training it there would resume that "
        "training's checkpoints as its own; allowed: another run folder, e.g. run_name=sd_860m_res_512_v1_1 "
        f"(and training.init_from={launched} to start from its weights)"
    )


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("training.model.unet_config.model_channels=384", "UNet model_channels 320 there, 384 here"),
        (
            "training.model.data.train.augmentations.center_crop_h_w='128, 128'",
            "(128x128 px, max_steps 82500)",
        ),
        ("training.run.name=other", "this launch is other (256x256 px"),
    ],
)
def test_another_unet_resolution_or_name_is_another_training(
    make_config: Callable, launched: Path, override: str, said: str
) -> None:
    with pytest.raises(ConfigError, match=r"^run_name: .* holds the training sd_860m_res_256") as refused:
        check_facts(make_config(*GPU, IMAGES, "run_name=shared", override), FIXED_FACTS)
    assert said in str(refused.value)


def test_the_same_training_passes_and_max_steps_may_be_raised(make_config: Callable, launched: Path) -> None:
    check_facts(make_config(*GPU, "run_name=shared"), FIXED_FACTS)
    check_facts(make_config(*GPU, "run_name=shared", "training.trainer.max_steps=100000"), FIXED_FACTS)
    # Lowered: allowed while the run has not passed it, refused once its checkpoints have.
    checkpoints = TrainingOutputs(launched).checkpoints
    checkpoints.mkdir(parents=True)
    (checkpoints / CKPT.format(step=5000)).write_bytes(b"")
    check_facts(make_config(*GPU, "run_name=shared", "training.trainer.max_steps=5000"), FIXED_FACTS)
    with pytest.raises(ConfigError) as refused:
        check_facts(make_config(*GPU, "run_name=shared", "training.trainer.max_steps=4000"), FIXED_FACTS)
    assert str(refused.value) == (
        f"training.trainer.max_steps: 4000 is below step 5000, which {launched}'s checkpoints of sd_860m_res_256 "
        "already reached; allowed: at least 5000 (raising it extends the run), or another run_name"
    )


def test_stages_without_training_may_use_the_folder(make_config: Callable, launched: Path) -> None:
    check_facts(
        make_config(
            "cluster=slurm",
            "run_name=shared",
            "stages=[data_preparation]",
            "training=stable_diffusion/860m_res_512_v1_1",
        ),
        FIXED_FACTS,
    )


def test_a_folder_launched_before_the_record_is_judged_by_its_nemo_config(make_config: Callable) -> None:
    """Its NeMo config says the training once NeMo has written there; a dry run's config alone does not."""
    cfg = make_config(*GPU, "run_name=old")
    outputs = TrainingOutputs(Path(cfg.base_results_dir) / "old")
    outputs.stage_dir.mkdir(parents=True)
    nemo = {"model": dict(cfg.training.model), "trainer": dict(cfg.training.trainer)}
    outputs.config("sd_860m_res_256").write_text(yaml.safe_dump(nemo))
    later = make_config(
        *GPU, "run_name=old", "training=stable_diffusion/860m_res_512_v1_1", "training.init_from=none"
    )
    check_facts(later, FIXED_FACTS)  # only a dry run wrote there
    outputs.checkpoints.mkdir(parents=True)
    (outputs.checkpoints / CKPT.format(step=1000)).write_bytes(b"")
    with pytest.raises(
        ConfigError, match=r"holds the training sd_860m_res_256 \(256x256 px, max_steps 82500\)"
    ):
        check_facts(later, FIXED_FACTS)


def test_a_record_that_does_not_read_is_refused(make_config: Callable, launched: Path) -> None:
    TrainingOutputs(launched).record.write_text("{")
    with pytest.raises(
        ConfigError, match=r"^run_name: .*training\.json does not read as the record of a training"
    ):
        check_facts(make_config(*GPU, "run_name=shared"), FIXED_FACTS)


def _stand_alone(tmp_path: Path, *extra: str) -> list[str]:
    """A training that needs no data, no assets, no data check and no cluster query (sbatch recorded)."""
    return [
        f"cluster.shared_dir={tmp_path}",
        *GPU,
        "container=none",
        f"container.python={sys.executable}",
        "assets.enable=false",
        "training.model.data.synthetic_data=true",
        "cluster.max_array_size=1000",
        "cluster.max_job_count=10000",
        *extra,
    ]


def test_a_launch_records_its_training_and_a_dry_run_does_not(tmp_path: Path, recording_sbatch: Path) -> None:
    run = tmp_path / "results/sd_860m_res_256"
    launch(compose_config(_stand_alone(tmp_path, "dry_run=true")))
    assert (run / "manifest.json").exists() and not TrainingOutputs(run).record.exists()
    launch(compose_config(_stand_alone(tmp_path)))
    assert recording_sbatch.read_text().count("\n") == 1
    record = json.loads(TrainingOutputs(run).record.read_text())
    cfg = to_schema(compose_config(_stand_alone(tmp_path)))
    assert record == json.loads(training_record.of_config(cfg).to_json())
    assert (record["name"], record["resolution"], record["max_steps"]) == (
        "sd_860m_res_256",
        [256, 256],
        82500,
    )
    assert record["unet"]["model_channels"] == 320 and record["unet"]["context_dim"] == 768
    assert not list(TrainingOutputs(run).stage_dir.glob(".*.tmp"))  # written atomically, nothing left over
