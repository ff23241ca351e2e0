"""ControlNet end to end on the real Slurm test cluster (issue 47.2's acceptance), on a CPU partition: the preset
plans the demo's data preparation, its hints step, data_check and NeMo's own controlnet_train.py (tiny, through
the launcher's CPU runner, both UNets from a tiny stand-in of SD 1.5's single-file checkpoint). The hints job
writes a <key>.png beside every sample; data_check draws NeMo's own ControlNet batches with the hint; training
reads a hint in every batch and moves the control stage; the samples job (NeMo's own controlnet_infer.py on
CPU) draws each prompt from its hint image; a plan whose tars have no hints is refused by the data_check job
naming the missing `.png`.

The rehearsal (rehearsal=true) runs NeMo's controlnet_train.py tiny on CPU before the training.

Parts that are STAND-INS: no container (the jobs run on this machine's interpreters through Slurm); the tiny
CLIP, VAE and checkpoint (random weights at CPU sizes)."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import compose_config
from fixtures.controlnet import PRESET, RUN, TINY_CONTROL
from fixtures.nemo import REPO, copy_folders
from fixtures.run_shared import shared_folder
from fixtures.slurm import cpu_partition_argv, set_cluster_env
from nemo_cpu.harness import samples_on_cpu, unet_load_report
from nemo_cpu.tiny import TINY_OVERRIDES
from PIL import Image

from launcher import manifest
from launcher.cli import launch
from launcher.outputs import RehearsalOutputs
from launcher.plugins.controlnet.family import CKPT_FILE

pytestmark = pytest.mark.slow

CONTROLNET_TRAIN_CPU = REPO / "tests" / "nemo_cpu" / "controlnet_train_cpu.py"
CONTROLNET_INFER_CPU = REPO / "tests" / "nemo_cpu" / "controlnet_infer_cpu.py"
PROMPTS = ("a house by a lake", "a boat at sea")
CROP = "training.model.data.train.augmentations"
# One CPU node of one process: a micro batch of 2, a global batch of 2 (the launcher sets the accelerator).
TINY = [o for o in TINY_OVERRIDES if "_batch_size=" not in o and ".accelerator=" not in o]
TRAINING = (
    PRESET,
    *TINY,
    *TINY_CONTROL,
    "training.trainer.num_nodes=1",
    "training.model.micro_batch_size=2",
    "training.model.global_batch_size=2",
    "training.trainer.max_steps=2",
    "training.exp_manager.checkpoint_callback_params.every_n_train_steps=2",
    f"{CROP}.resize_smallest_side=64",  # the demo's 256 px images at 64 px crops: 8x8 latents
    f"{CROP}.center_crop_h_w='64, 64'",
    # The hint reaches the UNet through two zero-initialised convolutions in series (ControlNet's input hint
    # block and its output convs): after two Adam steps its effect is about lr^2, so a large rate makes the
    # tiny model's samples depend on the hint visibly (the samples test).
    "training.model.optim.lr=0.2",
    f"training.run.script={CONTROLNET_TRAIN_CPU}",
)

_ZERO_CONVS_MOVED = """
import sys, torch
state = torch.load(sys.argv[1], map_location="cpu", weights_only=False)["state_dict"]
convs = [v for k, v in state.items() if ".control_model.zero_convs." in k and k.endswith("weight")]
print(bool(convs) and all(bool(v.any()) for v in convs))
"""


def _argv(shared: Path, nemo_python: str, *overrides: str) -> list[str]:
    return [
        *cpu_partition_argv(shared),
        "data_preparation=demo",
        "data_preparation.precache.enable=false",  # refused for ControlNet
        "assets.enable=false",  # the tiny assets and checkpoint are staged already (or no model is read)
        f"data_check.python={nemo_python}",
        "data_check.batches=2",
        "data_check.micro_batch_size=2",
        f"training.run.python={nemo_python}",
        *TRAINING,
        *overrides,
    ]


def _states(cluster, run: Path, names: set[str] | None = None) -> dict[str, tuple[set[str], str]]:
    """{job: (its states, its log)} once every job of the run (or those named) has ended."""
    found = {}
    for record in manifest.load(run):
        if names is None or record.name in names:
            states = {job.state for job in cluster.wait_jobs(record.job_id, timeout=900)}
            log = next(run.glob(f"*/logs/{record.name}_*.out"), None)
            found[record.name] = (states, log.read_text() if log else "")
    return found


def _failure(jobs: dict[str, tuple[set[str], str]]) -> str:
    """The first job that did not complete, its states and its log's end; empty when all did."""
    failed = (
        f"{name} {states}: {log[-4000:]}" for name, (states, log) in jobs.items() if states != {"COMPLETED"}
    )
    return next(failed, "")


@dataclass(frozen=True)
class ControlNetRun:
    """The module's one tiny ControlNet run on the cluster: its shared folder, run folder and jobs."""

    shared: Path
    run: Path
    jobs: dict[str, tuple[set[str], str]]
    python: str  # NeMo's interpreter


@pytest.fixture(scope="module")
def controlnet_run(slurm_cluster, nemo_python: str, tiny_assets: Path) -> Iterator[ControlNetRun]:
    """The preset's data preparation, hints, data_check and training, launched once for the module; the
    stand-in checkpoint is written first from the training config a dry run renders."""
    shared = copy_folders(tiny_assets, shared_folder("slurm-controlnet-"), "models")
    stages = "stages=[data_preparation,data_check,training]"
    rehearsal = (
        "rehearsal=true",
        f"rehearsal.script={CONTROLNET_TRAIN_CPU}",
        f"rehearsal.python={nemo_python}",
    )
    try:
        with pytest.MonkeyPatch.context() as patch:
            set_cluster_env(slurm_cluster, patch)
            launch(compose_config(_argv(shared, nemo_python, stages, *rehearsal, "dry_run=true")))
            config = next((shared / "results" / RUN / "training").glob("*.yaml"))
            ckpt = shared / "models" / "sd15-ckpt" / CKPT_FILE  # where the assets job stages SD 1.5's
            ckpt.parent.mkdir(parents=True)
            written = subprocess.run(
                [nemo_python, str(CONTROLNET_TRAIN_CPU), "--write-checkpoint", str(config), str(ckpt)],
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert written.returncode == 0, (written.stdout + written.stderr)[-3000:]
            run = launch(compose_config(_argv(shared, nemo_python, stages, *rehearsal)))
            yield ControlNetRun(shared, run, _states(slurm_cluster, run), nemo_python)
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_the_hints_job_writes_a_hint_beside_every_sample_and_data_check_reads_it(
    controlnet_run: ControlNetRun,
) -> None:
    """data_check's model check too: NeMo's ControlledUnetModel, the VAE and CLIP built from the config."""
    jobs = controlnet_run.jobs
    names = list(jobs)
    assert names.index("generate_wdinfo") < names.index("controlnet_hints") < names.index("data_check")
    for name in names[: names.index("data_check") + 1]:
        assert jobs[name][0] == {"COMPLETED"}, (name, jobs[name][0], jobs[name][1][-4000:])
    assert "220 Canny hints written" in jobs["controlnet_hints"][1], jobs["controlnet_hints"][1][-2000:]
    tars = sorted((controlnet_run.shared / "data_512" / "tarfiles_reorganized").glob("*.tar"))
    assert len(tars) == 11
    for path in tars:
        with tarfile.open(path) as tar:
            names_in = tar.getnames()
        keys = {name.partition(".")[0] for name in names_in}
        assert {f"{key}.png" for key in keys} <= set(names_in), path
    report = json.loads((controlnet_run.run / "data_check" / "report.json").read_text())
    assert report["ok"] and report["family"] == "controlnet", report["errors"]
    assert report["loader"]["hint"] == [2, 64, 64, 3], report["loader"]
    assert set(report["models"]) == {"unet", "vae", "text_encoder"}, report["models"]


def test_nemo_trains_controlnet_on_the_hints_with_a_hint_in_every_batch(
    controlnet_run: ControlNetRun,
) -> None:
    run = controlnet_run
    assert not _failure(run.jobs), _failure(run.jobs)
    log = run.jobs[RUN][1]
    assert "cpu_training: patched" in log and "controlnet_train_cpu: running NeMo's own" in log, log[-3000:]
    batches = re.findall(r"controlnet_train_cpu: batch hint=\[2, 64, 64, 3\]", log)
    assert len(batches) >= 2, log[-4000:]  # a batch read for each step (none: NeMo dropped every sample)
    line, counts = unet_load_report(log)
    assert counts["missing"] == 0 and counts["equal"] == counts["total"], line
    equal, total = map(int, re.search(r"control from_pretrained_unet: equal=(\d+) of (\d+)", log).groups())
    # Every control tensor but the hint encoder and the zero convolutions (ControlNet's own) is the UNet's.
    assert total > equal > total // 2, (equal, total)
    losses = [float(v) for v in re.findall(r"reduced_train_loss=([0-9.]+)", log)]
    assert losses and all(0 < loss < 10 for loss in losses), losses
    print(
        f"batches {len(batches)}, control tensors {equal}/{total}, losses {sorted(set(losses), reverse=True)}"
    )
    last = sorted((run.run / "training" / "results" / "checkpoints").glob("*step=2*-last.ckpt"))
    assert last, sorted(run.run.glob("training/**/*.ckpt"))
    # Training moved the control stage's zero-initialised convolutions (what feeds the hint to the UNet).
    moved = subprocess.run(
        [run.python, "-c", _ZERO_CONVS_MOVED, str(last[0])], capture_output=True, text=True
    )
    assert moved.returncode == 0 and moved.stdout.split() == ["True"], moved.stdout + moved.stderr[-2000:]


def test_the_rehearsal_trains_a_tiny_controlnet_on_cpu_before_the_training(
    controlnet_run: ControlNetRun,
) -> None:
    """NeMo's controlnet_train.py on the hinted data: step 1, its checkpoint, step 2 resumed, one image drawn
    by the plugin's sampler (rehearsal.py) from the trained ControlLDM; the training waited for it."""
    states, log = controlnet_run.jobs["rehearsal"]
    assert states == {"COMPLETED"}, log[-4000:]
    names = list(controlnet_run.jobs)
    assert names.index("data_check") < names.index("rehearsal") < names.index(RUN), names
    report = json.loads(RehearsalOutputs(controlnet_run.run).report.read_text())
    assert report["ok"], report
    assert "model.control_stage_config.params.from_pretrained_unet" in "\n".join(report["changes"]), report
    print(f"rehearsal {report['seconds']} s, changes: {report['changes']}")
    sample = Path(report["sample"])
    with Image.open(sample) as image:
        assert image.size == (64, 64) and np.asarray(image).std() > 0, image.size


def _hint(path: Path, seed: int) -> Path:
    """A hint image: white strokes on black, as Canny edges are, at another size than the trained 64 px."""
    image = np.zeros((48, 80, 3), np.uint8)
    for row in np.random.default_rng(seed).integers(0, 48, 6):
        image[row, :] = 255
    Image.fromarray(image).save(path)
    return path


def _sample(cluster, run: ControlNetRun, hints: tuple[Path, Path]) -> dict[str, bytes]:
    """stages=[samples] on the cluster (the .nemo training saved at its end, NeMo's controlnet_infer.py on
    CPU), each prompt drawn from its hint; returns the images it wrote, by name."""
    out = launch(
        compose_config(
            _argv(
                run.shared,
                run.python,
                "stages=[samples]",
                *samples_on_cpu(run.python, CONTROLNET_INFER_CPU),
                "samples.mem=4G",
                "samples.steps=5",
                "samples.images_per_prompt=1",
                "samples.precision=32-true",  # the CPU runner's (its docstring)
                f"samples.prompts=[{','.join(PROMPTS)}]",
                f"controlnet_hints.hint_images=[{hints[0]},{hints[1]}]",
            )
        )
    )
    states, log = _states(cluster, out, {"samples"})["samples"]
    assert states == {"COMPLETED"}, (states, log[-4000:])
    assert "controlnet_infer_cpu: running NeMo's own" in log, log[-3000:]
    images = out / "samples" / "step_2" / "images"
    assert (out / "samples" / "step_2" / "grid.png").is_file(), log[-3000:]
    return {path.name: path.read_bytes() for path in images.glob("*_0.png")}


def test_the_samples_job_draws_from_the_hint_images(
    slurm_cluster, controlnet_run: ControlNetRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same prompts and seed twice: the first prompt from the same hint (the same image: sampling is
    deterministic), the second from another hint (another image: the hint is read)."""
    assert not _failure(controlnet_run.jobs), _failure(controlnet_run.jobs)
    set_cluster_env(slurm_cluster, monkeypatch)
    folder = controlnet_run.shared / "hints"  # where the jobs can read (pytest's tmp dirs are 0700)
    folder.mkdir()
    edges, other = _hint(folder / "edges.png", 0), _hint(folder / "other.png", 1)
    first = _sample(slurm_cluster, controlnet_run, (edges, edges))
    second = _sample(slurm_cluster, controlnet_run, (edges, other))
    names = [f"{prompt}_0.png" for prompt in PROMPTS]
    assert sorted(first) == sorted(second) == sorted(names), sorted(first)
    for name in names:
        with Image.open(io.BytesIO(first[name])) as image:
            assert image.size == (64, 64) and np.asarray(image).std() > 0  # the trained size, a picture
    assert first[names[0]] == second[names[0]]
    changed = np.abs(
        np.asarray(Image.open(io.BytesIO(first[names[1]]))).astype(int)
        - np.asarray(Image.open(io.BytesIO(second[names[1]]))).astype(int)
    )
    print(f"pixels changed by the other hint: {(changed > 0).mean():.2%}, by up to {changed.max()}")
    assert changed.max() > 0


def test_a_plan_on_tars_without_hints_is_refused_by_data_check_naming_png(
    slurm_cluster, slurm_demo: Path, slurm_shared: Path, nemo_python: str
) -> None:
    """The demo's tars as SD's data preparation wrote them (jpg + txt), checked for ControlNet."""
    run = launch(
        compose_config(
            _argv(
                slurm_shared,
                nemo_python,
                "stages=[data_check]",
                "data_check.model_check=false",  # the tars alone are checked
                f"data_dir={slurm_demo}/data",  # read only: the run folder is under slurm_shared
            )
        )
    )
    states, log = _states(slurm_cluster, run)["data_check"]
    assert states == {"FAILED"}, (states, log[-4000:])
    report = json.loads((run / "data_check" / "report.json").read_text())
    assert report["errors"] and all("no .png members" in e for e in report["errors"]), report["errors"]
    assert "no .png members" in log and "data check FAILED" in log, log[-3000:]
