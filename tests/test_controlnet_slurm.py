"""ControlNet's jobs on the real Slurm test cluster (issue 47.2's acceptance): the preset plans data preparation,
its hints step and data_check; the hints job writes a <key>.png beside every sample of the demo's tars and
data_check then draws NeMo's own ControlNet batches with the hint; a plan whose tars have no hints is refused
by the data_check job naming the missing `.png`.

Parts that are STAND-INS: no container (the jobs run on this machine's interpreters through Slurm)."""

from __future__ import annotations

import json
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import compose_config
from fixtures.nemo import copy_folders
from nemo_cpu.tiny import TINY_OVERRIDES

from launcher import manifest
from launcher.cli import launch

pytestmark = pytest.mark.slow

CROP = "training.model.data.train.augmentations"


def _launch(shared: Path, nemo_python: str, *overrides: str) -> Path:
    return launch(
        compose_config(
            [
                f"cluster.shared_dir={shared}",
                "cluster=slurm",
                "container=none",
                f"container.python={sys.executable}",
                "data_preparation=demo",
                "data_preparation.precache.enable=false",  # refused for ControlNet
                "training=controlnet/sd15_512",
                "assets.enable=false",  # the tiny assets are staged already (or no model is read)
                f"data_check.python={nemo_python}",
                "data_check.batches=2",
                "data_check.micro_batch_size=2",
                f"{CROP}.resize_smallest_side=64",
                f"{CROP}.center_crop_h_w='64, 64'",
                *overrides,
            ]
        )
    )


def _states(cluster, run: Path) -> dict[str, tuple[set[str], str]]:
    """{job: (its states, its log)} once every job of the run has ended."""
    found = {}
    for record in manifest.load(run):
        states = {job.state for job in cluster.wait_jobs(record.job_id, timeout=600)}
        log = next(run.glob(f"*/logs/{record.name}_*.out"), None)
        found[record.name] = (states, log.read_text() if log else "")
    return found


def test_the_hints_job_writes_a_hint_beside_every_sample_and_data_check_reads_it(
    slurm_cluster, slurm_shared: Path, nemo_python: str, tiny_assets: Path
) -> None:
    """data_check's model check too: NeMo's ControlledUnetModel, the VAE and CLIP built from the config."""
    copy_folders(tiny_assets, slurm_shared, "models")
    tiny = [o for o in TINY_OVERRIDES if "_batch_size=" not in o and ".accelerator=" not in o]
    run = _launch(slurm_shared, nemo_python, "stages=[data_preparation,data_check]", *tiny)
    jobs = _states(slurm_cluster, run)
    for name, (states, log) in jobs.items():
        assert states == {"COMPLETED"}, (name, states, log[-4000:])
    names = list(jobs)
    assert names.index("generate_wdinfo") < names.index("controlnet_hints") < names.index("data_check")
    assert "220 Canny hints written" in jobs["controlnet_hints"][1], jobs["controlnet_hints"][1][-2000:]
    tars = sorted((slurm_shared / "data_512" / "tarfiles_reorganized").glob("*.tar"))
    assert len(tars) == 11
    for path in tars:
        with tarfile.open(path) as tar:
            names_in = tar.getnames()
        keys = {name.partition(".")[0] for name in names_in}
        assert {f"{key}.png" for key in keys} <= set(names_in), path
    report = json.loads((run / "data_check" / "report.json").read_text())
    assert report["ok"] and report["family"] == "controlnet", report["errors"]
    assert report["loader"]["hint"] == [2, 64, 64, 3], report["loader"]
    assert set(report["models"]) == {"unet", "vae", "text_encoder"}, report["models"]


def test_a_plan_on_tars_without_hints_is_refused_by_data_check_naming_png(
    slurm_cluster, slurm_demo: Path, slurm_shared: Path, nemo_python: str
) -> None:
    """The demo's tars as SD's data preparation wrote them (jpg + txt), checked for ControlNet."""
    run = _launch(
        slurm_shared,
        nemo_python,
        "stages=[data_check]",
        "data_check.model_check=false",  # the tars alone are checked
        f"data_dir={slurm_demo}/data",  # read only: the run folder is under slurm_shared
    )
    jobs = _states(slurm_cluster, run)
    states, log = jobs["data_check"]
    assert states == {"FAILED"}, (states, log[-4000:])
    report = json.loads((run / "data_check" / "report.json").read_text())
    assert report["errors"] and all("no .png members" in e for e in report["errors"]), report["errors"]
    assert "no .png members" in log and "data check FAILED" in log, log[-3000:]
