"""training.init_from with NeMo's own code on CPU: the session's tiny run at 256 px (tests/fixtures/nemo.py,
EMA on) is the earlier stage; a second tiny run at 128 px (a different resolution, as 512 px follows 256 px
in NVIDIA's curriculum; 512 px crops would be slow on CPU) starts its UNet from it: the init job
(launcher/jobs/init_unet.py) extracts the UNet, and NeMo loads it with zero missing and zero unexpected keys,
every tensor as saved, then trains 2 steps from step 0 in its own folder.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures.nemo import TinyTraining
from nemo_cpu.harness import init_job_argv, render_training, run_init_job, run_sd_train, unet_load_report
from omegaconf import OmegaConf

from launcher import checkpoint_index
from launcher.init_from import UNET_PREFIX
from launcher.outputs import TrainingOutputs
from launcher.stages import training_init
from launcher.throughput import read_training_progress

pytestmark = pytest.mark.slow


def _size(px: int) -> tuple[str, str]:
    augment = "training.model.data.train.augmentations"
    return f"{augment}.resize_smallest_side={px}", f"{augment}.center_crop_h_w='{px}, {px}'"


@pytest.fixture(scope="module")
def shared(new_shared) -> Path:
    """The demo's data and the tiny assets (tests/fixtures/nemo.py), this module's own copy."""
    return new_shared()


@pytest.fixture(scope="module")
def earlier(tiny_training: TinyTraining) -> TrainingOutputs:
    """The first stage: the session's tiny run at 256 px, 4 steps, EMA kept (only read here)."""
    return TrainingOutputs(tiny_training.run)


def test_a_tiny_run_writes_its_final_checkpoint_and_ema_twin(earlier: TrainingOutputs) -> None:
    final = earlier.newest_weights()
    # The EMA weights of the last step (NeMo keeps a top-k copy beside the -last one: the same weights).
    assert final is not None and "-step=4-consumed_samples=8.0-" in final.name
    assert final.name.endswith("-EMA.ckpt")
    assert "center_crop_h_w: 256, 256" in earlier.configs()[0].read_text()
    # NeMo's own checkpoint passes the check init_from makes on the login node, read without torch.
    model = OmegaConf.to_container(OmegaConf.load(earlier.hparams).cfg, resolve=True)
    training_init.check_checkpoint(final, model)


def test_a_512_style_run_starts_its_unet_from_the_256_style_run(
    shared: Path, nemo_python: str, earlier: TrainingOutputs
) -> None:
    final = earlier.newest_weights()
    second = render_training(
        shared, "res128", f"training.init_from={earlier.run_dir}", "training.trainer.max_steps=2", *_size(128)
    )
    later = TrainingOutputs(shared / "results/res128")
    text = second.read_text()
    assert f"from_pretrained: {later.init_unet}" in text and "from_NeMo: true" in text
    assert "center_crop_h_w: 128, 128" in text

    assert init_job_argv(later.run_dir) == [str(earlier.run_dir), str(later.init_unet)]
    extract = run_init_job(nemo_python, later.run_dir)
    assert extract.returncode == 0, extract.stderr[-4000:]
    assert later.init_source.read_text().strip() == str(final)  # the EMA weights of the last step
    # The login node's reading (no torch, no tensor loaded) finds the tensors torch.load finds.
    unet = [name for name in checkpoint_index.tensor_shapes(final) if name.startswith(UNET_PREFIX)]
    assert f"init_from: {len(unet)} UNet tensors of {final}" in extract.stdout

    trained = run_sd_train(nemo_python, second, shared / "res128.log")
    assert trained.returncode == 0, trained.stderr[-4000:]
    log = (shared / "res128.log").read_text()
    assert f"Attempting to load pretrained unet from {later.init_unet}" in log
    report, counts = unet_load_report(log)
    print(extract.stdout.strip(), report, sep="\n")  # shown with -s: the numbers the report quotes
    assert (counts["missing"], counts["unexpected"], counts["mismatched"], counts["errors"]) == (0,) * 4
    assert counts["equal"] == counts["total"] > 0  # every UNet tensor as the earlier run saved it
    assert "Restored all states" not in log  # optimizer, step and schedule start fresh
    progress = read_training_progress(shared / "res128.log", global_batch_size=2, num_gpus=1)
    assert progress is not None and (progress.last_step, progress.consumed_samples) == (2, 4)
    assert later.newest_checkpoint(ema=False) is not None
    assert "-step=2-" in later.newest_checkpoint(ema=False).name
