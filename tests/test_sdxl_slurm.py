"""SDXL's whole chain on the real test cluster (issue 30): the assets job stages SDXL's encoders and VAE from
the fake Hub (converting the VAE's key names), the demo's data preparation, data_check with NeMo's model check
of the SDXL config, then the three SDXL presets chained through training.init_from, and `status` of each run.

The GPU parts are STAND-INS: tests/standin_sd_train.py in place of NeMo's sd_xl_train.py (it trains nothing;
its checkpoints are real torch files holding every tensor of the UNet NeMo's UNetModel builds from the
config), and no container. The Hub serves the session's tiny assets (tests/nemo_cpu/tiny.py), the SDXL VAE
under current diffusers' names as the Hub's file has them. Sizes are SDXL_OVERRIDES' (tiny UNet, CPU
encoders, fsdp off), the same for the three stages so that each continues the last.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.launches import REPO, run_status, standin_training
from fixtures.nemo import copy_folders
from fixtures.slurm import dependency
from hf_fake_hub import FakeHub
from nemo_cpu.tiny import OPEN_CLIP_WIDTH, SDXL_OVERRIDES, SDXL_VAE_FILE, WIDTH

from launcher import manifest
from launcher.cli import compose_config, launch
from launcher.outputs import TrainingOutputs

pytestmark = pytest.mark.slow
STAGE_1, STAGE_2, STAGE_3 = (
    "sdxl_base_train_res_256_stage_1",
    "sdxl_base_train_res_512_stage_2",
    "sdxl_base_train_res_1024_stage_3",
)
# The tiny sizes; the batch sizes are the stand-in training's (8 fake GPUs), the accelerator the preset's.
TINY = [o for o in SDXL_OVERRIDES if ".accelerator=" not in o and "_batch_size=" not in o]
SDXL_ASSETS = ("text_encoder", "open_clip_bigg", "sdxl_vae")
NODES = "nodename=n1,n2"


@pytest.fixture
def hub(slurm_shared: Path, tiny_assets: Path, nemo_python: str) -> Iterator[FakeHub]:
    """The fake Hub serving SDXL's three asset repos at their pinned commits: the tiny CLIP and OpenCLIP, and
    the tiny SDXL VAE saved under current diffusers' names in vae/ (and not under NeMo's anywhere)."""
    served = copy_folders(tiny_assets, slurm_shared / "hub", "models") / "models"
    assets = compose_config([]).assets
    nemo_named = served / SDXL_VAE_FILE
    current = nemo_named.parent / assets.sdxl_vae.nemo_vae.source
    # diffusers is not in NeMo's venv: vae_names_cpu renames NeMo's tiny VAE file as current diffusers saves.
    save = "import sys, pathlib; sys.path.insert(0, sys.argv[1]); import vae_names_cpu as v; "
    save += "v.save_current_diffusers(*map(pathlib.Path, sys.argv[2:]))"
    done = subprocess.run(
        [nemo_python, "-c", save, str(REPO / "tests/nemo_cpu"), str(nemo_named), str(current)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    nemo_named.unlink()
    (current.parent / "config.json").write_text("{}")
    repos = {
        assets[name].repo_id: {assets[name].revision: served / Path(assets[name].local_dir).name}
        for name in SDXL_ASSETS
    }
    with FakeHub({}, models=repos) as fake:
        yield fake


def _launch(shared: Path, nemo_python: str, stage: str, *overrides: str) -> dict[str, str]:
    """The SDXL preset `stage` (its run folder named after it), the stand-in for sd_xl_train.py; job ids."""
    launch(
        compose_config(
            standin_training(
                shared,
                stage,
                nemo_python,
                f"training=sdxl/{stage}",
                *TINY,
                # The slurm preset caches SD's latents, which SDXL cannot read: the image tars.
                "data_preparation.precache.enable=false",
                *overrides,
                synthetic_data=False,  # NeMo's SDXL has none: the preset's data folder
            )
        )
    )
    return {r.name: r.job_id for r in manifest.load(shared / "results" / stage) if r.job_id}


def _completed(slurm_cluster, ids: dict[str, str]) -> None:
    for name, job_id in ids.items():
        states = {j.state for j in slurm_cluster.wait_jobs(job_id, timeout=600)}
        assert states == {"COMPLETED"}, (name, job_id, states)


def _status_rows(run: Path) -> dict[str, str]:
    """`status` of the run folder: its job table's rows by job name."""
    done = run_status(str(run), cwd=REPO, env={"COLUMNS": "250"})
    assert done.returncode == 0, done.stderr
    lines = [line.rstrip() for line in done.stdout.splitlines()]
    title = lines.index(f"run {run}")
    assert lines[title + 1].split()[:2] == ["job", "id"], done.stdout
    rows = lines[title + 2 : lines.index("", title)]
    return {row.split()[0]: row for row in rows}


def _log(run: Path, name: str, job_id: str) -> str:
    return next(run.glob(f"*/logs/{name}_{job_id}.out")).read_text()


def test_assets_data_model_check_and_three_chained_stages_run_and_status_reads_them(
    slurm_cluster, slurm_shared: Path, drained: None, nemo_python: str, hub: FakeHub
) -> None:
    shared = slurm_shared
    for side in ("512", "1024"):  # the later presets' data folders: the demo's tars that stage 1 prepares
        (shared / f"data_sdxl_{side}").symlink_to("data_sdxl_256")
    first = _launch(
        shared,
        nemo_python,
        STAGE_1,
        "stages=[data_preparation,data_check,training]",
        "data_preparation=demo",
        "assets.enable=true",
        f"+env.HF_ENDPOINT={hub.url}",
        "data_check.enable=true",
        f"data_check.python={nemo_python}",
        "training.run.chain=2",
    )
    runs = {stage: shared / "results" / stage for stage in (STAGE_1, STAGE_2, STAGE_3)}
    edges = {r.name: r.depends_on for r in manifest.load(runs[STAGE_1])}
    assert edges["pretrained_assets"] == []
    assert set(edges["data_check"]) == {"afterok:pretrained_assets", "afterok:generate_wdinfo"}, edges
    assert edges[f"{STAGE_1}_part0"] == ["afterok:data_check"]

    # Stage 1's training held in the queue while its data is prepared and checked (the launch of stage 2
    # needs the data in place); then stage 2, whose init job waits on stage 1's last part, by its id.
    training = {name: job_id for name, job_id in first.items() if name.startswith(STAGE_1)}
    slurm_cluster.run_command(["scontrol", "hold", *training.values()])
    slurm_cluster.run_command(["scontrol", "update", NODES, "state=resume"])
    _completed(slurm_cluster, {name: job_id for name, job_id in first.items() if name not in training})
    second = _launch(shared, nemo_python, STAGE_2, f"training.init_from={runs[STAGE_1]}")
    assert set(second) == {f"{STAGE_2}_init", STAGE_2}
    assert dependency(slurm_cluster, second[f"{STAGE_2}_init"]).startswith(
        f"afterok:{first[f'{STAGE_1}_part1']}"
    )
    assert dependency(slurm_cluster, second[STAGE_2]).startswith(f"afterok:{second[f'{STAGE_2}_init']}")
    slurm_cluster.run_command(["scontrol", "release", *training.values()])
    _completed(slurm_cluster, first | second)

    # Stage 3 once stage 2 has ended: the launch checks stage 2's final checkpoint (its UNet's tensors).
    third = _launch(shared, nemo_python, STAGE_3, f"training.init_from={runs[STAGE_2]}")
    assert set(third) == {f"{STAGE_3}_init", STAGE_3}
    assert dependency(slurm_cluster, third[STAGE_3]).startswith(f"afterok:{third[f'{STAGE_3}_init']}")
    _completed(slurm_cluster, third)

    # The assets job staged the SDXL VAE under NeMo's names, converted once from the Hub's file.
    staged = json.loads((shared / "models/sdxl-vae/.complete.json").read_text())
    (written,) = staged["written"]
    assert written["kind"] == "nemo-vae" and written["args"][1] == "diffusion_pytorch_model.safetensors"
    assert "16 key(s) renamed" in _log(runs[STAGE_1], "pretrained_assets", first["pretrained_assets"])
    # data_check: NeMo's SDXL loader read the demo's tars (stored at the training side, the tiny 64 px), and
    # NeMo built the UNet, the staged VAE (every key loaded) and both text encoders.
    report = json.loads((runs[STAGE_1] / "data_check/report.json").read_text())
    assert report["ok"], report["errors"]
    assert report["latent"] is False and report["loader"]["images"][1:] == [64, 64, 3]  # resize_smallest_side
    assert set(report["models"]) == {"unet", "vae", "text_encoder"}
    vae = report["models"]["vae"]
    assert vae["file"] == str(shared / "models" / SDXL_VAE_FILE)
    assert (
        vae["class"].endswith(".AutoencoderKLInferenceWrapper") and vae["missing"] == vae["unexpected"] == 0
    )
    encoders = report["models"]["text_encoder"].values()  # CLIP's hidden layer 11 and OpenCLIP's
    assert [e["embedding_shape"][-1] for e in encoders] == [WIDTH, OPEN_CLIP_WIDTH]

    # Each later stage starts from the earlier one's final checkpoint: every UNet tensor, with its step.
    for earlier, later, ids, step in ((STAGE_1, STAGE_2, second, 2), (STAGE_2, STAGE_3, third, 1)):
        final = TrainingOutputs(runs[earlier]).newest_weights()
        assert final is not None and f"-step={step}-" in final.name
        outputs = TrainingOutputs(runs[later])
        assert outputs.init_source.read_text().strip() == str(final)
        init_log = _log(runs[later], f"{later}_init", ids[f"{later}_init"])
        count = int(init_log.split("init_from: ")[1].split()[0])
        assert count > 100 and f"UNet tensors of {final}" in init_log
        log = _log(runs[later], later, ids[later])
        assert (
            f"standin from_pretrained {outputs.init_unet}: {count} tensor(s), UNet value {float(step)}" in log
        )
        assert "standin starting from scratch" in log

    # status reads each run folder: one line per job, every one COMPLETED.
    for stage, ids in ((STAGE_1, first), (STAGE_2, second), (STAGE_3, third)):
        rows = _status_rows(runs[stage])
        assert list(rows) == [r.name for r in manifest.load(runs[stage])], rows
        assert set(rows) >= set(ids)
        assert all(" COMPLETED " in row for row in rows.values()), rows
