"""NeMo's own Stable Diffusion training code on the training config the launcher renders.

NeMo 2.4.1's MegatronLatentDiffusion, MegatronTrainerBuilder, exp_manager, data loader, Lightning
fit loop, checkpointing and resume run on CPU on the demo's tars, with tiny CLIP/VAE assets laid out
as the assets job lays them out. Only sizes, asset paths and the device differ from what users get
(tests/nemo_cpu/tiny.py); the CUDA/apex-only calls patched are listed in tests/nemo_cpu/sd_train_cpu.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.throughput import read_training_progress
from nemo_cpu.harness import prepare_demo_data, render_training, run_sd_train, write_tiny_assets

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory, nemo_python: str) -> Path:
    shared_dir = tmp_path_factory.mktemp("nemo_cpu")
    prepare_demo_data(shared_dir)
    write_tiny_assets(nemo_python, shared_dir)
    return shared_dir


def _checkpoints(config: Path) -> list[str]:
    return sorted(p.name for p in (config.parent / "results" / "checkpoints").iterdir())


def test_nemo_trains_checkpoints_and_resumes(shared: Path, nemo_python: str) -> None:
    every2 = "training.exp_manager.checkpoint_callback_params.every_n_train_steps=2"
    config = render_training(shared, "train", "training.trainer.max_steps=2", every2)
    first = run_sd_train(nemo_python, config, shared / "first.log")
    assert first.returncode == 0, first.stderr[-4000:]
    log = (shared / "first.log").read_text()
    assert f"Attempting to load vae weights from {shared}/models/sd-vae-ft-mse/" in log
    assert "Missing:" not in log and "Unexpected:" not in log  # NeMo only prints VAE key mismatches
    assert "`max_steps=2` reached" in log
    progress = read_training_progress(shared / "first.log", global_batch_size=2, num_gpus=1)
    assert progress is not None and (progress.last_step, progress.consumed_samples) == (2, 4)
    assert any("-step=2-" in name and name.endswith("-last.ckpt") for name in _checkpoints(config))

    config = render_training(shared, "train", "training.trainer.max_steps=4", every2)
    second = run_sd_train(nemo_python, config, shared / "second.log")
    assert second.returncode == 0, second.stderr[-4000:]
    log = (shared / "second.log").read_text()
    assert "Restored all states from the checkpoint at" in log and "step=2-consumed_samples=4.0-last.ckpt" in log
    progress = read_training_progress(shared / "second.log", global_batch_size=2, num_gpus=1)
    assert progress is not None and (progress.last_step, progress.consumed_samples) == (4, 8)
    assert any("-step=4-" in name and name.endswith("-last.ckpt") for name in _checkpoints(config))


@pytest.mark.parametrize(
    ("override", "nemo_says"),
    [
        # The keys the preset had before NeMo judged it (NeMo 1.23 names; 2.x rejects them).
        ("+training.model.unet_config.enable_amp_o2_fp16=false", "unexpected keyword argument 'enable_amp_o2_fp16'"),
        ("training.model.ddp_overlap=true", "Either distributed_fused_adam or megatron_amp_O2 needs to be set"),
    ],
)
def test_nemo_rejects_the_keys_the_old_preset_had(shared: Path, nemo_python: str, override: str,
                                                  nemo_says: str) -> None:  # fmt: skip
    config = render_training(shared, "bad", "training.trainer.max_steps=1", override)
    proc = run_sd_train(nemo_python, config, shared / "bad.log")
    assert proc.returncode != 0
    assert nemo_says in proc.stdout + proc.stderr
