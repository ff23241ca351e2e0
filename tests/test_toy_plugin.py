"""A model family from outside the checkout (issue 47's acceptance): tests/toy_family/ is its own distribution
(pyproject.toml with entry points for its family and its data step), installed by `pip install` into a venv of
its own (tests/fixtures/plugins.py), never by the tests' hook. The launcher in that venv plans it through the
whole chain with its preset from its own conf folder, its own asset and its own stage; on the real test
cluster its jobs, whose interpreters do not have it installed (the suite's venv and NeMo's), find it in the
run folder's copy: its data step runs from there, data_check, the rehearsal and samples each recognise it
in their own processes.

Parts that are STAND-INS: no container (the jobs run on this machine's interpreters through Slurm).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from coco_fixture import make_coco
from fixtures.launches import REPO
from fixtures.nemo import copy_folders
from nemo_cpu.harness import SD_TRAIN_CPU, samples_on_cpu
from nemo_cpu.tiny import TINY_OVERRIDES

from launcher import manifest

RUN = "toy_256"
CROP = "training.model.data.train.augmentations"


def _launcher(venv: Path, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`python launcher/main.py ...` (or `-m launcher ...`) with the toy venv's interpreter."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    return subprocess.run(
        [str(venv / "bin" / "python"), *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**env, "COLUMNS": "200"},
    )


def test_the_installed_family_is_planned_through_the_whole_chain(toy_venv: Path, tmp_path: Path) -> None:
    (tmp_path / "nemo.sqsh").write_bytes(b"hsqs")
    done = _launcher(
        toy_venv,
        str(REPO / "launcher" / "main.py"),
        "cluster=aws_p5",
        f"cluster.shared_dir={tmp_path}",
        f"container.mounts=[{tmp_path}:{tmp_path}]",
        f"container.image={tmp_path}/nemo.sqsh",
        "training=toy/tiny_256",  # the preset from the toy's own conf folder
        "stages=[data_preparation,data_check,training,samples,evaluation]",
        "rehearsal=true",
        f"evaluation.coco_root={make_coco(tmp_path / 'coco')}",
        "cluster.gpu_type=H100",
        "dry_run=true",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    run = tmp_path / "results" / RUN
    jobs = {job["name"]: job for job in json.loads((run / "manifest.json").read_text())["jobs"]}
    stages = list(dict.fromkeys(job["stage"] for job in jobs.values()))
    assert stages == [
        "assets",
        "data_preparation",
        "toy_marks",  # its own data step, right after the stage it extends
        "data_check",
        "rehearsal",
        "training",
        "samples",
        "evaluation",
    ]
    assert "toy_marks" in " ".join(jobs["data_check"]["depends_on"])
    assert "--asset toy_notes toy-org/toy-notes" in (run / "assets" / "pretrained_assets.sbatch").read_text()
    samples = json.loads((run / "samples" / "samples.json").read_text())
    assert (samples["family"], samples["sampler"]) == ("toyldm", "DDIM")
    assert json.loads((run / "training" / f"{RUN}.family.json").read_text())["family"] == "toyldm"
    assert "Toy LDM at 256 px" in done.stdout  # its own published speed in the cost line
    # The distribution as its jobs import it, and their PYTHONPATH naming that copy.
    copy = run / "plugins"
    assert (copy / "toy_ldm_family" / "family.py").is_file()
    assert (
        "toy_marks = toy_ldm_family.stage:STAGE"
        in (copy / "toy_ldm_family-0.1.0.dist-info" / "entry_points.txt").read_text()
    )
    assert (
        f"export PYTHONPATH=/workspace/launcher:{copy}"
        in (run / "toy_marks" / "toy_marks.sbatch").read_text()
    )


ORDER = """
import itertools, json, sys
from launcher import cli, families, groups
models = {p: cli.compose_config([f"training={p}"]).training.model for p in groups.options("training")}
seen = set()
for order in itertools.permutations(list(families.FAMILIES)):
    families.FAMILIES[:] = order
    seen.add(json.dumps({p: families.family_of(m).name for p, m in models.items()}, sort_keys=True))
print(json.dumps([json.loads(s) for s in seen]))
"""


def test_the_order_of_registration_changes_no_answer(toy_venv: Path, tmp_path: Path) -> None:
    done = _launcher(toy_venv, "-c", ORDER, cwd=REPO)
    assert done.returncode == 0, done.stderr
    (answers,) = json.loads(done.stdout)  # one answer for every order
    assert answers["toy/tiny_256"] == "toyldm" and answers["stable_diffusion/860m_res_256_pretrain"] == "sd1"


@pytest.mark.slow
def test_its_jobs_recognise_it_in_their_own_processes_on_the_test_cluster(
    toy_venv: Path, slurm_cluster, slurm_shared: Path, nemo_python: str, tiny_assets: Path
) -> None:
    shared = slurm_shared
    copy_folders(tiny_assets, shared, "models")
    tiny = [o for o in TINY_OVERRIDES if "_batch_size=" not in o and ".accelerator=" not in o]
    done = _launcher(
        toy_venv,
        str(REPO / "launcher" / "main.py"),
        f"cluster.shared_dir={shared}",
        "cluster=slurm",
        "container=none",
        f"container.python={sys.executable}",  # the suite's venv: the toy is not installed there
        "cluster.gpus_per_node=0",
        "cluster.cpus_per_node=2",
        "stages=[data_preparation,data_check,training,samples]",
        "rehearsal=true",
        "assets.enable=false",  # the tiny assets are staged already
        "data_preparation=demo",
        "data_preparation.precache.enable=false",
        "training=toy/tiny_256",
        *tiny,
        f"{CROP}.resize_smallest_side=64",
        f"{CROP}.center_crop_h_w='64, 64'",
        "training.trainer.num_nodes=1",
        "training.model.micro_batch_size=2",
        "training.model.global_batch_size=2",
        "training.trainer.max_steps=2",
        "training.exp_manager.checkpoint_callback_params.every_n_train_steps=2",
        f"training.run.script={SD_TRAIN_CPU}",
        f"training.run.python={nemo_python}",
        f"rehearsal.script={SD_TRAIN_CPU}",
        f"rehearsal.python={nemo_python}",
        f"data_check.python={nemo_python}",
        *samples_on_cpu(nemo_python),
        "samples.mem=4G",
        "samples.steps=2",
        "samples.images_per_prompt=1",
        "samples.prompts=[a red bicycle]",
        cwd=shared,
    )
    assert done.returncode == 0, done.stderr
    run = shared / "results" / RUN
    records = manifest.load(run)
    for record in records:
        states = {job.state for job in slurm_cluster.wait_jobs(record.job_id, timeout=900)}
        log = next(run.glob(f"*/logs/{record.name}_*.out"), None)
        text = log.read_text() if log else ""
        assert states == {"COMPLETED"}, (record.name, states, text[-6000:])
    assert [r.name for r in records].index("toy_marks") < [r.name for r in records].index("data_check")
    marks = json.loads((shared / "data" / "toy_marks.json").read_text())
    assert marks["family"] == "Toy LDM" and marks["tars"] > 0
    assert Path(marks["module"]).is_relative_to(run / "plugins")  # run from the run folder's copy
    assert json.loads((run / "data_check" / "report.json").read_text())["family"] == "toyldm"
    report = json.loads((run / "rehearsal" / "report.json").read_text())
    assert report["ok"] and report["family"] == "toyldm", report
    samples = next(run.glob("samples/logs/samples_*.out")).read_text()
    # The trained model claimed by the toy in the job, sampled with its default sampler.
    assert "a Toy LDM model, DDIM" in samples, samples[-3000:]
    assert (run / "samples" / "step_2" / "grid.png").is_file()
    status = _launcher(toy_venv, "-m", "launcher", "status", str(run), cwd=REPO)
    assert status.returncode == 0 and "samples: newest grid samples/step_2/grid.png" in status.stdout, status
