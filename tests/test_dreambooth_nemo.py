"""DreamBooth with NeMo's own code on CPU (issue 47): the plugin's presets at tiny sizes from the tiny SD 1.x
repo as training.weights; the dreambooth stage's job draws the regularization images with NeMo's own
prepare_reg_data on the base model, then NeMo's own dreambooth.py trains 2 steps on the instance folder and
those images, full and LoRA, without drawing any itself."""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path

import pytest
from fixtures.dreambooth import (
    NEMO_DREAMBOOTH,
    REG_IMAGES,
    DreamBoothRun,
    instance_folder,
    nemo_env,
    overrides,
    run_regularization,
    run_training,
)
from fixtures.finetune import stage_weights
from fixtures.nemo import REPO
from nemo_cpu.harness import CONVERT_CPU, render_training
from omegaconf import OmegaConf

from launcher.plugins.dreambooth.family import FAMILY
from launcher.plugins.dreambooth.train import MODULE
from launcher.sampling.world import one_process_world

pytestmark = pytest.mark.slow
PNG = b"\x89PNG\r\n\x1a\n"


def _train(nemo_python: str, shared: Path, repo: Path) -> DreamBoothRun:
    instance = instance_folder(shared / "instance")
    name = "dreambooth_full"
    given = overrides(False, repo, instance, f"training.run.python={nemo_python}")
    staged = stage_weights(given, shared)
    assert staged.returncode == 0, staged.stdout + staged.stderr
    render_training(shared, name, *given, tiny=())
    run = shared / "results" / name
    script = NEMO_DREAMBOOTH
    drawn = run_regularization(nemo_python, run, script)
    assert drawn.returncode == 0, (drawn.stdout + drawn.stderr)[-4000:]
    config = next((run / "training").glob("*.yaml"))
    trained = run_training(nemo_python, config, script)
    assert trained.returncode == 0, (trained.stdout + trained.stderr)[-4000:]
    regularization = run / "dreambooth_regularization"
    return DreamBoothRun(run, instance, regularization, drawn.stdout + drawn.stderr, trained.stdout)


@pytest.fixture(scope="module")
def dreamboothed(
    nemo_python: str, tiny_repos: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> DreamBoothRun:
    """The full preset's regularization job and training, once for the module (about 12 s of CPU)."""
    return _train(nemo_python, tmp_path_factory.mktemp("dreambooth"), tiny_repos["sd1"])


def test_the_base_model_draws_the_regularization_images_before_training(
    dreamboothed: DreamBoothRun, nemo_python: str
) -> None:
    run = dreamboothed
    images = sorted(run.regularization.iterdir())
    # NeMo draws num_images_per_prompt (2) a call until the count is reached: 4 for 3 asked.
    assert len(images) == 4 >= REG_IMAGES, images
    assert all(path.read_bytes().startswith(PNG) for path in images)
    assert len({path.read_bytes() for path in images}) == len(images)  # each drawn, none copied
    assert not list(run.regularization.parent.glob(".*.part")), "the staging folder is left"
    assert f"drawing {REG_IMAGES} images" in run.reg_log
    # Launched again it finds them and draws nothing.
    again = run_regularization(nemo_python, run.run, NEMO_DREAMBOOTH)
    assert again.returncode == 0 and "nothing to draw" in again.stdout, again.stderr[-2000:]
    assert sorted(run.regularization.iterdir()) == images


def test_nemo_dreambooth_trains_on_instance_and_regularization_images(
    dreamboothed: DreamBoothRun,
) -> None:
    run = dreamboothed
    opened = [Path(p) for p in re.findall(r"dreambooth_cpu: image (.+)", run.log)]
    instance = {p.name for p in opened if p.parent == run.instance}
    regularization = {p.name for p in opened if p.parent == run.regularization}
    assert instance and regularization, opened
    assert len(instance) + len(regularization) == len(set(opened))  # nothing read from elsewhere
    assert "No enough images in regularization folder" not in run.log  # NeMo drew none itself
    steps = re.findall(r"dreambooth_cpu: step=(\d+) loss=(\S+) trainable=(\d+) total=(\d+)", run.log)
    assert [int(s[0]) for s in steps] == [0, 1], steps
    assert all(math.isfinite(float(s[1])) for s in steps), steps
    trainable, total = int(steps[-1][2]), int(steps[-1][3])
    assert total // 10 < trainable < total, steps[-1]  # the whole UNet; the VAE and text encoder frozen
    assert sorted(run.checkpoints.glob("*step=2*.ckpt")), list(run.checkpoints.iterdir())


def _convert(
    nemo_python: str, checkpoint: Path, hparams: Path, out: Path
) -> subprocess.CompletedProcess[str]:
    """NeMo's convert_ckpt_to_nemo.py (CPU runner) as the samples job runs it, in a world of one process."""
    argv = [
        nemo_python,
        "-u",
        str(CONVERT_CPU),
        *("--checkpoint_folder", str(checkpoint.parent), "--checkpoint_name", checkpoint.name),
        *("--hparams_file", str(hparams), "--nemo_file_path", str(out), "--model_type", "stable_diffusion"),
    ]
    env = {**nemo_env(NEMO_DREAMBOOTH), **one_process_world()}
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)


def test_nemos_conversion_refuses_the_dreambooth_checkpoint_and_reads_it_rewritten(
    dreamboothed: DreamBoothRun, nemo_python: str, tmp_path: Path
) -> None:
    """Why the samples job rewrites it (checkpoint.py): NeMo renames MegatronDreamBooth's modules only when the
    first key is a buffer transformers no longer saves, so its strict load meets model.unet.* and fails."""
    trained = sorted(dreamboothed.checkpoints.glob("*step=2*-last.ckpt"))[0]
    raw = _convert(
        nemo_python, trained, dreamboothed.checkpoints.parent / "hparams.yaml", tmp_path / "raw.nemo"
    )
    assert raw.returncode != 0 and "Unexpected key(s)" in raw.stderr and "model.unet." in raw.stderr, (
        raw.stderr[-2000:]
    )
    assert not (tmp_path / "raw.nemo").exists()
    code = (
        "import sys, yaml; from pathlib import Path; from launcher.plugins.dreambooth.checkpoint import as_sd; "
        "as_sd(Path(sys.argv[1]), yaml.safe_load(Path(sys.argv[2]).read_text())['cfg'], Path(sys.argv[3]))"
    )
    hparams = dreamboothed.checkpoints.parent / "hparams.yaml"
    done = subprocess.run(
        [nemo_python, "-c", code, str(trained), str(hparams), str(tmp_path / "sd")],
        cwd=REPO,
        env=nemo_env(NEMO_DREAMBOOTH),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rewritten = tmp_path / "sd" / "checkpoints" / trained.name
    converted = _convert(nemo_python, rewritten, tmp_path / "sd" / "hparams.yaml", tmp_path / "model.nemo")
    assert converted.returncode == 0, (converted.stdout + converted.stderr)[-3000:]
    assert (tmp_path / "model.nemo").stat().st_size > 0


def _steps(log: str) -> list[tuple[int, float, int, int]]:
    found = re.findall(r"dreambooth_cpu: step=(\d+) loss=(\S+) trainable=(\d+) total=(\d+)", log)
    return [(int(step), float(loss), int(trainable), int(total)) for step, loss, trainable, total in found]


def test_nemo_dreambooth_lora_trains_adapters_on_instance_and_regularization_images(
    dreamboothed: DreamBoothRun, nemo_python: str, tiny_repos: dict[str, Path]
) -> None:
    """The LoRA preset's config, trained as its job runs NeMo's dreambooth.py: under the plugin's program
    (Family.training_program), which binds the model_utils NeMo's module lacks; on the full run's images."""
    run = dreamboothed
    shared, name = run.run.parents[1], "dreambooth_lora"
    given = overrides(
        True,
        tiny_repos["sd1"],
        run.instance,
        f"dreambooth.regularization_dir={run.regularization}",
        f"training.run.python={nemo_python}",
        "training.model.peft.lora_tuning.adapter_dim=4",  # rank 32 is the tiny UNet's widths
    )
    render_training(shared, name, *given, tiny=())
    config = next((shared / "results" / name / "training").glob("*.yaml"))
    done = run_training(nemo_python, config, NEMO_DREAMBOOTH, "-m", FAMILY.training_program or "")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert f"dreambooth.train: bound {MODULE}.model_utils" in done.stdout
    opened = {Path(p).parent for p in re.findall(r"dreambooth_cpu: image (.+)", done.stdout)}
    assert opened == {run.instance, run.regularization}, opened
    steps, full = _steps(done.stdout), _steps(run.log)
    assert [s[0] for s in steps] == [0, 1] and all(math.isfinite(s[1]) for s in steps), steps
    trainable, total = steps[-1][2:]
    # Only the adapters train (what they added to the model), a small part of what the full DreamBooth trains.
    assert 0 < trainable == total - full[-1][3] < full[-1][2] // 20, (steps[-1], full[-1])
    print(f"LoRA trainable {trainable} of {total}; full DreamBooth {full[-1][2]} of {full[-1][3]}")
    assert sorted((shared / "results" / name / "training" / "results" / "checkpoints").glob("*step=2*.ckpt"))


def test_the_fix_is_applied_only_where_nemo_lacks_the_name(nemo_python: str) -> None:
    """train.bind_model_utils on NeMo's module: bound once; asked again (the name now there, as in a NeMo that
    imports it), nothing is done."""
    code = "from launcher.plugins.dreambooth.train import bind_model_utils as b; print(b()); print(b())"
    done = subprocess.run(
        [nemo_python, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    first, second = done.stdout.splitlines()[-2:]
    assert first.startswith(f"bound {MODULE}.model_utils") and "unpatched" in second, done.stdout


def test_a_crashed_attempt_s_whole_images_are_kept_and_its_half_written_one_dropped(
    dreamboothed: DreamBoothRun, nemo_python: str, tmp_path: Path
) -> None:
    """The job's staging (launcher/plugins/dreambooth/regularization.py): what a killed attempt left beside the
    folder is read back, the whole image kept and counted, the truncated one deleted; NeMo draws the rest."""
    config = OmegaConf.load(dreamboothed.run / "dreambooth" / "regularization.yaml")
    final = tmp_path / "regularization"
    config.model.data.regularization_dir = str(final)
    config.infer.out_path = str(final)
    (tmp_path / "dreambooth").mkdir()
    OmegaConf.save(config, tmp_path / "dreambooth" / "regularization.yaml")
    staged = tmp_path / f".{final.name}.part"
    staged.mkdir()
    kept = sorted(dreamboothed.regularization.iterdir())[0]
    (staged / "earlier_0_0.png").write_bytes(kept.read_bytes())
    (staged / "earlier_0_1.png").write_bytes(kept.read_bytes()[:200])  # killed while writing
    done = run_regularization(nemo_python, tmp_path, NEMO_DREAMBOOTH)
    assert done.returncode == 0, done.stderr[-3000:]
    names = sorted(path.name for path in final.iterdir())
    assert "earlier_0_0.png" in names and "earlier_0_1.png" not in names, names
    # NeMo counted the kept one and drew the 2 missing in (2 // 2 + 1) calls of 2 (prepare_reg_data's loop
    # draws one call more than it needs), numbered after it; nothing half-written, nothing left staged.
    assert len(names) == 1 + (2 // 2 + 1) * 2 and not staged.exists(), names
    assert "a photo of a dog_0_1.png" in names
    assert all((final / name).read_bytes().startswith(PNG) for name in names)
