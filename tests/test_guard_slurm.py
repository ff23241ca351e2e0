"""Issue 29's guards on the real test cluster: a continuation without init_from and a truncated checkpoint
are refused before anything is submitted, a 512 px launch into a 256 px run's folder is refused, and the
same training launched again resumes (max_steps raised).

NeMo's sd_train.py is replaced by tests/standin_sd_train.py (a STAND-IN, run with NeMo's interpreter): it
resumes from the newest checkpoint in the run folder and writes the next one, as NeMo does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch_checkpoints
import yaml
from conftest import compose_config
from fixtures.launches import standin_training
from omegaconf import OmegaConf

from launcher import manifest
from launcher.cli import launch
from launcher.errors import ConfigError
from launcher.outputs import TrainingOutputs

pytestmark = pytest.mark.slow


def test_a_continuation_without_init_from_is_refused_before_submission(
    slurm_shared: Path, recording_sbatch: Path, nemo_python: str
) -> None:
    overrides = standin_training(
        slurm_shared, "res512", nemo_python, "training=stable_diffusion/860m_res_512_v1_1"
    )
    with pytest.raises(
        ConfigError, match=r"^training\.init_from: not set, but sd_860m_res_512_v1_1 continues"
    ):
        launch(compose_config(overrides))
    assert not recording_sbatch.exists() and not (slurm_shared / "results").exists()


def test_a_512_launch_into_a_256_run_s_folder_is_refused_and_the_same_training_resumes(
    slurm_cluster, slurm_shared: Path, nemo_python: str
) -> None:
    run = slurm_shared / "results/res256"

    def train(*extra: str) -> dict[str, str]:
        launch(compose_config(standin_training(slurm_shared, "res256", nemo_python, *extra)))
        ids = {r.name: r.job_id for r in manifest.load(run) if r.job_id}
        assert slurm_cluster.wait_job(ids["sd_860m_res_256"], timeout=300).state == "COMPLETED"
        return ids

    first = train()
    record = json.loads(TrainingOutputs(run).record.read_text())
    assert (record["name"], record["resolution"], record["max_steps"]) == (
        "sd_860m_res_256",
        [256, 256],
        82500,
    )

    with pytest.raises(ConfigError) as refused:
        train("training=stable_diffusion/860m_res_512_v1_1", "training.init_from=none")
    assert str(refused.value).startswith(
        f"run_name: {run} holds the training sd_860m_res_256 (256x256 px, max_steps 82500); this launch is "
        "sd_860m_res_512_v1_1 (512x512 px, max_steps 50000)."
    )
    assert {r.name: r.job_id for r in manifest.load(run) if r.job_id} == first  # nothing submitted
    assert json.loads(TrainingOutputs(run).record.read_text()) == record

    again = train("training.trainer.max_steps=100000")  # the same training, extended
    assert again["sd_860m_res_256"] != first["sd_860m_res_256"]
    log = (
        TrainingOutputs(run).stage_dir / f"logs/sd_860m_res_256_{again['sd_860m_res_256']}.out"
    ).read_text()
    assert "standin resumed from step=1" in log
    assert "-step=2-" in TrainingOutputs(run).newest_checkpoint(ema=False).name
    assert json.loads(TrainingOutputs(run).record.read_text())["max_steps"] == 100000


def test_a_truncated_checkpoint_is_refused_before_submission(
    slurm_shared: Path, recording_sbatch: Path, nemo_python: str
) -> None:
    earlier = TrainingOutputs(slurm_shared / "results/res256")
    composed = compose_config(standin_training(slurm_shared, "res256", nemo_python))
    unet = OmegaConf.to_container(composed.training.model.unet_config, resolve=True)
    earlier.checkpoints.mkdir(parents=True)
    earlier.hparams.write_text(yaml.safe_dump({"cfg": {"unet_config": unet}}))
    whole = (
        earlier.checkpoints
        / "stable-diffusion--reduced_train_loss=0.10-step=9-consumed_samples=9.0-last.ckpt"
    )
    torch_checkpoints.write(nemo_python, {whole: torch_checkpoints.unet_860m()})
    whole.write_bytes(whole.read_bytes()[:-100])  # a copy cut short: its zip index is lost
    overrides = standin_training(slurm_shared, "res512", nemo_python, f"training.init_from={earlier.run_dir}")
    with pytest.raises(ConfigError, match=rf"^training\.init_from: {whole} is not a torch checkpoint"):
        launch(compose_config(overrides))
    assert not recording_sbatch.exists() and not (slurm_shared / "results/res512").exists()
