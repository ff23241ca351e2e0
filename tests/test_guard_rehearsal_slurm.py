"""The rehearsal for real (issue 29.8): NeMo's own training code on CPU in a Slurm job of the test cluster,
before the GPU chain (tests/standin_sd_train.py, a STAND-IN that trains nothing, and pyxis's SPANK
stand-in that runs NO container, as in tests/test_training_slurm.py).

NeMo's sd_train.py and sd_xl_train.py are not in NeMo's wheel: the rehearsal runs tests/nemo_cpu/
sd_train_cpu.py or sd_xl_train_cpu.py in their place (rehearsal.script), which make the same calls. The
planned UNet is the preset's width (320 channels); only the text widths and the VAE's size fit the tiny
staged assets (tests/nemo_cpu/tiny.py), and SDXL's UNet levels and image size are cut to keep the CPU run
short (the rehearsal keeps them as planned, as it keeps SD's).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import compose_config
from nemo_cpu.harness import SD_TRAIN_CPU, SD_XL_TRAIN_CPU
from nemo_cpu.tiny import OPEN_CLIP_ARCH, OPEN_CLIP_WIDTH, SDXL_CONDITIONER, VAE, WIDTH

from launcher import manifest
from launcher.cli import launch
from launcher.outputs import RehearsalOutputs

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
STANDIN = Path(__file__).resolve().parent / "standin_sd_train.py"
TRAINING = "sd_860m_res_256"
SDXL_TRAINING = "sdxl_base_train_res_256_stage_1"
# SD's 256 px preset with the tiny CLIP's width (the staged tiny assets), not the UNet's (the rehearsal
# shrinks that).
SD = (f"rehearsal.script={SD_TRAIN_CPU}", f"training.model.unet_config.context_dim={WIDTH}")
# SDXL's stage-1 preset at the tiny assets' widths (context: CLIP + OpenCLIP; vector: pooled OpenCLIP + 3
# size/crop embedders x 2 x 256) on the demo's data, with 2 UNet levels, 64 px images and sd_xl_train's CPU
# stand-in: the rehearsal's 64-channel UNet (num_head_channels 64) trains in seconds.
SDXL = (
    f"training=sdxl/{SDXL_TRAINING}",
    "training.data.folder=data",
    f"rehearsal.script={SD_XL_TRAIN_CPU}",
    f"training.model.unet_config.context_dim={WIDTH + OPEN_CLIP_WIDTH}",
    f"training.model.unet_config.adm_in_channels={OPEN_CLIP_WIDTH + 3 * 2 * 256}",
    f"{SDXL_CONDITIONER}.1.emb_model.arch={OPEN_CLIP_ARCH}",
    "training.model.unet_config.channel_mult=[1,2]",
    "training.model.unet_config.num_res_blocks=1",
    "training.model.unet_config.attention_resolutions=[1,2]",
    "training.model.unet_config.transformer_depth=[1,2]",
    "training.model.data.train.augmentations.resize_smallest_side=64",
)


def _launch(shared: Path, nemo_python: str, *overrides: str, run: str = TRAINING) -> dict[str, str]:
    """The launch of `overrides` (SD or SDXL, and a test's own) on the test cluster; {job: Slurm id}."""
    (shared / "nemo.sqsh").write_bytes(b"hsqs")  # preflight checks that the image exists
    launch(
        compose_config(
            [
                "cluster=slurm",
                "container=pyxis",
                "stages=[training]",
                "rehearsal=true",
                "data_check.enable=false",  # the rehearsal alone finds what is wrong
                "assets.enable=false",  # staged already (tests/test_assets_stage.py runs the assets job)
                "data_preparation.precache.enable=false",  # the demo's image tars
                f"cluster.shared_dir={shared}",
                "cluster.gpus_per_node=1",
                "cluster.gpu_job_mem=1G",
                f"container.mounts=[{shared}:{shared}]",
                f"container.image={shared}/nemo.sqsh",
                f"container.python={sys.executable}",
                f"container.code_dir={REPO}",
                f"training.run.script={STANDIN}",
                f"training.run.python={sys.executable}",
                f"rehearsal.python={nemo_python}",
                "training.trainer.num_nodes=1",
                "training.model.micro_batch_size=2",
                "training.model.global_batch_size=2",
                "training.trainer.max_steps=2",
                # The staged tiny VAE's sizes.
                f"training.model.first_stage_config.ddconfig.ch={VAE['ch']}",
                f"training.model.first_stage_config.ddconfig.ch_mult={VAE['ch_mult']}".replace(" ", ""),
                f"training.model.first_stage_config.ddconfig.num_res_blocks={VAE['num_res_blocks']}",
                *overrides,
            ]
        )
    )
    return {r.name: r.job_id for r in manifest.load(shared / "results" / run) if r.job_id}


def _status(run: Path) -> str:
    argv = [sys.executable, "-m", "launcher", "status", str(run)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO, env={**os.environ})
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def cluster_env(slurm_cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)


def test_a_correct_plan_rehearses_then_the_gpu_chain_runs(
    slurm_cluster, cluster_env: None, nemo_shared: Path, nemo_python: str
) -> None:
    ids = _launch(nemo_shared, nemo_python, *SD)
    run = nemo_shared / "results" / TRAINING
    edges = {r.name: r.depends_on for r in manifest.load(run)}
    assert edges == {"rehearsal": [], TRAINING: ["afterok:rehearsal"]}
    rehearsal = slurm_cluster.wait_job(ids["rehearsal"], timeout=600)
    out = RehearsalOutputs(run)
    log = next((run / "rehearsal/logs").glob("rehearsal_*.out")).read_text()
    assert rehearsal.state == "COMPLETED", log[-3000:]
    assert slurm_cluster.wait_job(ids[TRAINING], timeout=120).state == "COMPLETED"
    report = json.loads(out.report.read_text())
    assert report["ok"] and report["unet_channels"] == [WIDTH, 320]
    # NeMo's own code ran: a fresh step 1 and its checkpoint, then a new process resumed it to step 2.
    assert report["step1"]["steps"] == 1 and report["step1"]["resumed_from"] is None
    assert report["step2"]["steps"] == 2 and report["step2"]["resumed_from"].endswith(
        "-step=1-consumed_samples=1.0-last.ckpt"
    )
    assert report["step1"]["unet_input"] == [1, 4, 32, 32]  # the demo's 256 px images through the VAE
    assert "Restored all states from the checkpoint" in log and "`max_steps=2` reached" in log
    assert out.sample.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The GPU stand-in ran after it, from the planned config (its real UNet width).
    training_log = next((run / "training/logs").glob(f"{TRAINING}_*.out")).read_text()
    assert "standin starting from scratch" in training_log
    assert "model_channels: 320" in (run / f"training/{TRAINING}.yaml").read_text()
    shown = " ".join(_status(run).split())  # rich wraps long lines at the terminal's width
    assert f"NeMo trained a {WIDTH}-channel UNet (planned: 320) for 2 steps on {nemo_shared}/data/" in shown
    assert "resumed from its step-1 checkpoint, sampled rehearsal/sample.png" in shown


def test_a_plan_only_nemo_can_refuse_fails_the_rehearsal_and_no_gpu_job_starts(
    slurm_cluster, cluster_env: None, nemo_shared: Path, nemo_python: str
) -> None:
    """The text encoder's path exists but holds the VAE, not a CLIP model: no login-node check can tell."""
    not_clip = nemo_shared / "models/sd-vae-ft-mse"
    ids = _launch(nemo_shared, nemo_python, *SD, f"training.model.cond_stage_config.version={not_clip}")
    run = nemo_shared / "results" / TRAINING
    assert slurm_cluster.wait_job(ids["rehearsal"], timeout=600).state == "FAILED"
    assert slurm_cluster.wait_job(ids[TRAINING], timeout=60).state == "CANCELLED"  # kill-on-invalid-dep
    assert not list((run / "training/logs").glob("*.out"))  # never started
    log = next((run / "rehearsal/logs").glob("rehearsal_*.out")).read_text()
    # The program's last line (srun adds its own after it), NeMo's traceback above it.
    (line,) = [line for line in log.splitlines() if line.startswith("rehearsal: error:")]
    assert line == (
        "rehearsal: error: NeMo's training, step 1 of 2 (from scratch): training.model.cond_stage_config "
        f"(FrozenCLIPEmbedder): NeMo cannot build it: OSError: Can't load tokenizer for '{not_clip}'."
    )
    assert "Traceback" in log
    # status: the rehearsal's line, and the job's own last line as why it failed (not srun's after it).
    shown = " ".join(_status(run).split())  # rich wraps long lines at the terminal's width
    assert f"rehearsal: FAILED: {line.removeprefix('rehearsal: error: ')}" in shown
    assert f"why jobs failed (the last error line of their logs): {line}" in shown


def test_an_sdxl_plan_rehearses_with_nemos_sd_xl_train(
    slurm_cluster, cluster_env: None, nemo_shared: Path, nemo_python: str
) -> None:
    """Issue 36.2: SDXL's preset rehearsed as SD's is: NeMo's MegatronDiffusionEngine (sd_xl_train's path)
    with FSDP off and the text encoders on CPU, 2 steps with a checkpoint and its resume, one image drawn
    as sd_xl_infer draws it; the same report and status line."""
    ids = _launch(nemo_shared, nemo_python, *SDXL, run=SDXL_TRAINING)
    run = nemo_shared / "results" / SDXL_TRAINING
    rehearsal = slurm_cluster.wait_job(ids["rehearsal"], timeout=600)
    log = next((run / "rehearsal/logs").glob("rehearsal_*.out")).read_text()
    assert rehearsal.state == "COMPLETED", log[-3000:]
    report = json.loads(RehearsalOutputs(run).report.read_text())
    assert report["ok"] and report["unet_channels"] == [64, 320]
    assert "model.fsdp: True -> False (FSDP needs a GPU" in " ".join(report["changes"])
    assert report["step1"]["steps"] == 1 and report["step1"]["resumed_from"] is None
    assert (
        report["step2"]["steps"] == 2
        and "-step=1-consumed_samples=1.0-last.ckpt" in report["step2"]["resumed_from"]
    )
    assert report["step1"]["unet_input"] == [1, 4, 8, 8]  # resize_smallest_side 64 through the VAE
    assert "sd_xl_train_cpu: running" in log and "Restored all states from the checkpoint" in log
    assert "Sampling with EulerEDMSampler" in log  # NeMo's SamplingPipeline, sd_xl_infer's default sampler
    assert RehearsalOutputs(run).sample.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert slurm_cluster.wait_job(ids[SDXL_TRAINING], timeout=120).state == "COMPLETED"
    shown = " ".join(_status(run).split())
    assert f"NeMo trained a 64-channel UNet (planned: 320) for 2 steps on {nemo_shared}/data/" in shown
    assert "resumed from its step-1 checkpoint, sampled rehearsal/sample.png" in shown
