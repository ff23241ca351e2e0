"""NeMo's own Stable Diffusion training code on the training config the launcher renders.

NeMo 2.4.1's MegatronLatentDiffusion, MegatronTrainerBuilder, exp_manager, data loader, Lightning
fit loop, checkpointing and resume run on CPU on the demo's tars, with tiny CLIP/VAE assets laid out
as the assets job lays them out. Only sizes, asset paths and the device differ from what users get
(tests/nemo_cpu/tiny.py); the CUDA/apex-only calls patched are listed in tests/nemo_cpu/sd_train_cpu.py.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from fixtures.nemo import TinyTraining
from nemo_cpu.harness import batches_drawn, render_training, run_data_check, run_sd_train

from launcher.throughput import read_training_progress

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def shared(new_shared) -> Path:
    """The demo's data and the tiny assets (tests/fixtures/nemo.py), this module's own copy."""
    return new_shared()


def _checkpoints(config: Path) -> list[str]:
    return sorted(p.name for p in (config.parent / "results" / "checkpoints").iterdir())


def test_nemo_trains_checkpoints_and_resumes(tiny_training: TinyTraining) -> None:
    """The session's tiny run (tests/fixtures/nemo.py): 2 steps from scratch, then resumed to 4."""
    shared, config = tiny_training.shared, tiny_training.config
    log = tiny_training.first_log.read_text()
    assert f"Attempting to load vae weights from {shared}/models/sd-vae-ft-mse/" in log
    assert "Missing:" not in log and "Unexpected:" not in log  # NeMo only prints VAE key mismatches
    assert "`max_steps=2` reached" in log
    progress = read_training_progress(tiny_training.first_log, global_batch_size=2, num_gpus=1)
    assert progress is not None and (progress.last_step, progress.consumed_samples) == (2, 4)
    assert any("-step=2-" in name and name.endswith("-last.ckpt") for name in tiny_training.first_checkpoints)

    log = tiny_training.second_log.read_text()
    assert (
        "Restored all states from the checkpoint at" in log and "step=2-consumed_samples=4.0-last.ckpt" in log
    )
    progress = read_training_progress(tiny_training.second_log, global_batch_size=2, num_gpus=1)
    assert progress is not None and (progress.last_step, progress.consumed_samples) == (4, 8)
    assert any("-step=4-" in name and name.endswith("-last.ckpt") for name in _checkpoints(config))


def test_a_resumed_run_draws_new_samples_not_its_first_ones(tiny_training: TinyTraining) -> None:
    """A new part (issue 37.4): NeMo's loader on the demo's tars takes the data position from the name of the
    checkpoint it resumes (consumed_samples=4.0), so steps 3 and 4 are given samples that steps 1 and 2 were
    not, where a loader starting again would give the same ones."""
    first = batches_drawn(tiny_training.first_log.read_text())
    second = batches_drawn(tiny_training.second_log.read_text())
    assert [step for step, _, _ in first] == [0, 1] and [step for step, _, _ in second] == [2, 3], (
        first,
        second,
    )
    before = [sample for _, _, samples in first for sample in samples]
    after = [sample for _, _, samples in second for sample in samples]
    assert len(set(before)) == len(before) == 4 and len(set(after)) == 4, (before, after)
    assert not set(before) & set(after), (before, after)


@pytest.mark.parametrize(
    ("override", "nemo_says"),
    [
        # The keys the preset had before NeMo judged it (NeMo 1.23 names; 2.x rejects them).
        (
            "+training.model.unet_config.enable_amp_o2_fp16=false",
            "unexpected keyword argument 'enable_amp_o2_fp16'",
        ),
        (
            "training.model.ddp_overlap=true",
            "Either distributed_fused_adam or megatron_amp_O2 needs to be set",
        ),
    ],
)
def test_nemo_rejects_the_keys_the_old_preset_had(
    shared: Path, nemo_python: str, override: str, nemo_says: str
) -> None:
    config = render_training(shared, "bad", "training.trainer.max_steps=1", override)
    proc = run_sd_train(nemo_python, config, shared / "bad.log")
    assert proc.returncode != 0
    assert nemo_says in proc.stdout + proc.stderr


def _data_check(nemo_python: str, config: Path) -> tuple[int, dict]:
    return run_data_check(
        nemo_python, config, config.parent / "report.json", "--model-check", "--batches", "1"
    )


def test_model_check_builds_the_three_modules_from_the_staged_assets(shared: Path, nemo_python: str) -> None:
    code, report = _data_check(nemo_python, render_training(shared, "check"))
    assert code == 0, report["errors"]
    models = report["models"]
    assert models["unet"]["parameters"] > 0
    assert models["vae"]["file"] == str(shared / "models/sd-vae-ft-mse/diffusion_pytorch_model.safetensors")
    assert models["text_encoder"]["embedding_shape"] == [1, 80, 32]  # 77 tokens padded to a multiple of 8


def _vae_with_renamed_key(nemo_python: str, shared: Path) -> Path:
    bad = shared / "models/bad-vae/diffusion_pytorch_model.safetensors"
    bad.parent.mkdir(parents=True, exist_ok=True)
    code = (
        "import sys; from safetensors.torch import load_file, save_file; s = load_file(sys.argv[1]); "
        "s['encoder.conv_in.weight_renamed'] = s.pop('encoder.conv_in.weight'); save_file(s, sys.argv[2])"
    )
    good = shared / "models/sd-vae-ft-mse/diffusion_pytorch_model.safetensors"
    subprocess.run([nemo_python, "-c", code, str(good), str(bad)], check=True, timeout=120)
    return bad


def test_model_check_fails_where_nemo_would_only_print(shared: Path, nemo_python: str) -> None:
    bad_vae = _vae_with_renamed_key(nemo_python, shared)
    config = render_training(
        shared,
        "check_bad",
        f"training.model.first_stage_config.from_pretrained={bad_vae}",
        "+training.model.unet_config.enable_amp_o2_fp16=false",
        "training.model.unet_config.context_dim=64",
    )
    code, report = _data_check(nemo_python, config)
    assert code == 1 and "models" in report
    errors = "\n".join(report["errors"])
    assert "model.unet_config: NeMo cannot build it" in errors and "enable_amp_o2_fp16" in errors
    assert "1 missing (e.g. encoder.conv_in.weight)" in errors
    assert "1 unexpected (e.g. encoder.conv_in.weight_renamed)" in errors
    assert "32-wide embeddings but model.unet_config.context_dim is 64" in errors


def test_nemo_stops_itself_and_checkpoints_before_the_job_limit(shared: Path, nemo_python: str) -> None:
    """The derived exp_manager.max_time_per_run (job limit less stop_before_limit_s) is what ends the run."""
    config = render_training(
        shared,
        "timed",
        "training.run.time_limit=21",
        "training.run.stop_before_limit_s=1252",
        "training.trainer.max_steps=100000",
    )
    assert "max_time_per_run: 00:00:00:08" in config.read_text()  # 21 min less 1252 s
    proc = run_sd_train(nemo_python, config, shared / "timed.log")
    assert proc.returncode == 0, proc.stderr[-4000:]
    log = (shared / "timed.log").read_text()
    # NeMo's StatelessTimer looks at the clock after each step: it fires on the first step end past 8 s,
    # later on a loaded machine.
    fired = re.search(r"Time limit reached\. Elapsed time is 0:00:(\d\d)", log)
    assert fired and 8 <= int(fired[1]) < 60
    # The steps trained, as the harness printed each one's start (the progress bar's last redraw may lag the
    # step the timer stopped at): the last started at global step N-1 and ended at N.
    last_step = batches_drawn(log)[-1][0] + 1
    assert 1 <= last_step < 100000
    last = [name for name in _checkpoints(config) if name.endswith("-last.ckpt")]
    assert last and f"-step={last_step}-" in last[0]  # NeMo saved where its timer stopped it
