"""training -> samples -> evaluation on the real Slurm test cluster, with STAND-INs for the GPU parts:
NeMo's sd_train.py (tests/standin_sd_train.py), its convert_ckpt_to_nemo.py, sd_infer.py and
generate_fid_images.py (tests/standin_sd_samples.py), and pyxis (the SPANK stand-in that runs no
container). The samples job, the evaluation's captions and score jobs are the real ones (the score with
stand-in networks: tests/nemo_cpu/tiny_eval.py)."""

from __future__ import annotations

import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from coco_fixture import make_coco
from conftest import compose_config
from PIL import Image

from launcher import manifest
from launcher.cli import launch

pytestmark = pytest.mark.slow
TESTS = Path(__file__).resolve().parent
TRAIN, SAMPLE = TESTS / "standin_sd_train.py", TESTS / "standin_sd_samples.py"


def _launch(shared: Path, *overrides: str) -> dict[str, str]:
    (shared / "nemo.sqsh").write_bytes(b"hsqs")  # preflight checks that the image exists
    wdinfo = shared / "data/tarfiles_reorganized/wdinfo.pkl"
    wdinfo.parent.mkdir(parents=True, exist_ok=True)
    tars = [f"{i:06d}.tar" for i in range(8)]  # never read by the stand-in
    wdinfo.write_bytes(pickle.dumps({"tar_files": tars, "chunk_size": 4, "total_key_count": 32}))
    run = launch(
        compose_config(
            [
                "cluster=slurm",
                "container=pyxis",
                "stages=[training,samples]",
                "data_check.enable=false",
                "data_preparation.precache.enable=false",  # the stand-in trains from the image tars' wdinfo
                "assets.enable=false",
                f"cluster.shared_dir={shared}",
                f"container.image={shared}/nemo.sqsh",
                f"container.python={sys.executable}",
                f"container.code_dir={TESTS.parent}",
                f"container.mounts=[{shared}:{shared},{TESTS.parent}:{TESTS.parent}]",
                f"training.run.script={TRAIN}",
                f"training.run.python={sys.executable}",
                "training.trainer.num_nodes=1",
                "training.model.micro_batch_size=4",
                "training.model.global_batch_size=32",
                "cluster.gpu_job_mem=1G",
                "training.run.chain=2",
                "training.trainer.max_steps=2",
                f"samples.python={sys.executable}",
                f"samples.convert_script={SAMPLE}",
                f"samples.infer_script={SAMPLE}",
                "samples.mem=1G",
                "samples.images_per_prompt=2",
                *overrides,
            ]
        )
    )
    return {r.name: r.job_id for r in manifest.load(run) if r.job_id}


def _status(run: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "launcher", "status", str(run)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)


def test_samples_wait_for_the_last_training_part_and_status_shows_the_grid(
    slurm_cluster, slurm_shared: Path
) -> None:
    ids = _launch(slurm_shared)
    parts = [slurm_cluster.wait_job(ids[f"sd_860m_res_256_part{k}"], timeout=120) for k in range(2)]
    assert [p.state for p in parts] == ["COMPLETED"] * 2
    assert slurm_cluster.wait_job(ids["samples"], timeout=120).state == "COMPLETED"
    run = slurm_shared / "results/sd_860m_res_256"
    record = next(r for r in manifest.load(run) if r.name == "samples")
    assert record.depends_on == ["afterok:sd_860m_res_256_part1"]  # submitted as afterok:<its job id>
    # It ran after the last part: the step-2 EMA checkpoint (part 1 wrote it) is the one sampled.
    log = (run / f"samples/logs/samples_{ids['samples']}.out").read_text()
    assert "-step=2-consumed_samples=2.0-EMA.ckpt (step 2)" in log and "standin convert" in log
    with Image.open(run / "samples/step_2/grid.png") as grid:
        assert grid.height > 8 * 256  # 8 default prompts, one row each, at the trained 256 px
    status = _status(run)
    assert "samples: newest grid samples/step_2/grid.png (1 checkpoint(s) sampled)" in status.stdout


def test_failed_training_cancels_the_samples(slurm_cluster, slurm_shared: Path) -> None:
    ids = _launch(slurm_shared, "training.run.chain=1", "training.run.python=/nonexistent/python")
    assert slurm_cluster.wait_job(ids["sd_860m_res_256"], timeout=60).state == "FAILED"
    assert slurm_cluster.wait_job(ids["samples"], timeout=60).state == "CANCELLED"


def test_training_samples_evaluation_chain_with_afterok_edges(
    slurm_cluster, slurm_shared: Path, nemo_python: str, tiny_eval_nets: Path
) -> None:
    nets = shutil.copytree(tiny_eval_nets, slurm_shared / "eval")  # inside the container's mounts
    coco = make_coco(slurm_shared / "coco")
    ids = _launch(
        slurm_shared,
        "stages=[training,samples,evaluation]",
        f"evaluation.coco_root={coco}",
        "evaluation.num_images=16",
        "evaluation.fid_features=64",  # 2048's FID takes 30 s of CPU per scale (an eigensolve)
        "evaluation.guidance_scales=[2,6]",
        f"evaluation.python={sys.executable}",
        f"evaluation.generate_script={SAMPLE}",
        f"evaluation.score_python={nemo_python}",
        f"assets.inception.path={nets / 'inception.pth'}",
        f"assets.text_encoder.local_dir={nets / 'clip'}",
        "evaluation.score_mem=2G",
    )
    assert slurm_cluster.wait_job(ids["eval_score"], timeout=600).state == "COMPLETED"
    run = slurm_shared / "results/sd_860m_res_256"
    records = {r.name: r.depends_on for r in manifest.load(run)}
    assert records["eval_captions"] == ["afterok:samples"]
    assert records["eval_generate"] == ["afterok:eval_captions"] and records["eval_score"] == [
        "afterok:eval_generate"
    ]
    logs = sorted((run / "evaluation/logs").glob("eval_generate_*.out"))
    assert len(logs) == 2 and all(
        log.read_text().count("standin generate") == 8 for log in logs
    )  # 8 GPUs each
    assert len(list((run / "evaluation/images/2.0").glob("*.png"))) == 16
    assert (run / "evaluation/results.md").exists() and (run / "evaluation/fid_clip.png").exists()
    status = _status(run)
    assert "samples: newest grid samples/step_2/grid.png" in status.stdout
    assert "evaluation: FID and CLIP score in evaluation/results.md" in status.stdout
