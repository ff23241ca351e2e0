"""The cached-latents chain on the real Slurm test cluster: image tars -> encode_latents (array) ->
latents_wdinfo -> data_check (NeMo's precached loader) -> training, each edge afterok.

Real: Slurm, the rendered sbatch scripts, the encode program running NeMo's own VAE and text encoder
(tiny, tests/nemo_cpu/tiny.py) and data_check running NeMo's loader. STAND-INS: the cluster's GPUs are
fake, so the encode step runs NeMo on CPU (precache.device=cpu); pyxis is the SPANK stand-in that runs
NO container; training is tests/standin_sd_train.py (trains nothing; test_latents_nemo.py trains NeMo
from latents).
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import compose_config
from fixtures.data import make_dataset
from fixtures.nemo import copy_folders
from nemo_cpu.tiny import TINY_OVERRIDES

from launcher import manifest
from launcher.cli import launch

pytestmark = pytest.mark.slow
STANDIN = Path(__file__).resolve().parent / "standin_sd_train.py"
AUG = "training.model.data.train.augmentations"
SMALL = [
    f"{AUG}.resize_smallest_side=64",
    f"{AUG}.center_crop_h_w='64, 64'",
    "training.model.unet_config.image_size=8",
]


@pytest.fixture
def shared(slurm_cluster, monkeypatch: pytest.MonkeyPatch, tiny_assets: Path) -> Iterator[Path]:
    """4 jpg/txt tars and their wdinfo where reorganize_tar leaves them, tiny assets where the assets job does."""
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    with tempfile.TemporaryDirectory(prefix="latents-", dir="/tmp") as tmp:
        root = Path(tmp)
        (root / "nemo.sqsh").write_bytes(b"hsqs")
        wdinfo = make_dataset(root / "made", tars=4, per_tar=4)
        tars = root / "data/tarfiles_reorganized"
        tars.mkdir(parents=True)
        for tar in (root / "made/shards").glob("*.tar"):
            tar.rename(tars / tar.name)
        (tars / "wdinfo.pkl").write_bytes(wdinfo.read_bytes())
        copy_folders(tiny_assets, root, "models")
        yield root


def _launch(shared: Path, nemo_python: str) -> dict[str, str]:
    tiny = [o for o in TINY_OVERRIDES if ".accelerator=" not in o and "_batch_size=" not in o]
    steps = ("demo", "download_parquet", "download_images", "reorganize_tar", "generate_wdinfo")
    launch(
        compose_config(
            [
                "cluster=slurm",
                "container=pyxis",
                "stages=[data_preparation,data_check,training]",
                *(f"data_preparation.{step}.enable=false" for step in steps),  # the image tars exist
                "data_preparation.precache.enable=true",
                "data_preparation.precache.num_tasks=2",
                "data_preparation.precache.device=cpu",
                "data_preparation.precache.batch_size=2",
                "assets.enable=false",  # no Hub here: tests/test_assets_stage.py runs the assets job
                "cluster.gpus_per_node=1",  # one encode process per task: NeMo on 2 CPU cores
                "cluster.gpu_job_mem=4G",
                f"cluster.shared_dir={shared}",
                f"container.mounts=[{shared}:{shared}]",
                f"container.image={shared}/nemo.sqsh",
                f"container.python={sys.executable}",
                f"training.run.python={nemo_python}",  # NeMo's interpreter, as in the container
                f"data_check.python={nemo_python}",
                "data_check.model_check=false",
                "data_check.micro_batch_size=2",
                f"training.run.script={STANDIN}",
                "training.trainer.num_nodes=1",
                "training.model.micro_batch_size=2",
                "training.model.global_batch_size=2",
                "training.trainer.max_steps=1",
                *tiny,
                *SMALL,
            ]
        )
    )
    return {r.name: r.job_id for r in manifest.load(shared / "results/sd_860m_res_256") if r.job_id}


def _log(shared: Path, stage: str, name: str) -> str:
    return "\n".join(
        p.read_text() for p in sorted((shared / f"results/sd_860m_res_256/{stage}/logs").glob(f"{name}_*"))
    )


def test_encode_array_then_wdinfo_then_data_check_then_training(
    slurm_cluster, shared: Path, nemo_python: str
) -> None:
    ids = _launch(shared, nemo_python)
    encode = [task.state for task in slurm_cluster.wait_jobs(ids["encode_latents"], timeout=600)]
    assert encode == ["COMPLETED"] * 2, _log(shared, "data_preparation", "encode_latents")[-3000:]
    order = ("latents_wdinfo", "data_check", "sd_860m_res_256")
    states = {name: slurm_cluster.wait_job(ids[name], timeout=600).state for name in order}
    assert states == dict.fromkeys(order, "COMPLETED"), _log(shared, "data_check", "data_check")[-3000:]
    edges = {r.name: r.depends_on for r in manifest.load(shared / "results/sd_860m_res_256")}
    assert edges == {
        "encode_latents": [],
        "latents_wdinfo": ["afterok:encode_latents"],
        "data_check": ["afterok:latents_wdinfo"],
        "sd_860m_res_256": ["afterok:data_check"],
    }
    encode = _log(shared, "data_preparation", "encode_latents")
    assert "worker 1/2: 2 tars in this slice" in encode and "worker 2/2: 2 tars in this slice" in encode
    assert "total_key_count 16" in _log(shared, "data_preparation", "latents_wdinfo")
    check = _log(shared, "data_check", "data_check")
    assert '"images": [2, 8, 8, 8], "images_dtype": "torch.float16"' in check and "data check passed" in check


def test_a_failed_encode_task_cancels_what_depends_on_it(
    slurm_cluster, shared: Path, nemo_python: str
) -> None:
    last = shared / "data/tarfiles_reorganized/00003.tar"  # the second task's slice
    last.write_bytes(last.read_bytes()[:1000])  # cut inside a member: the tar is unreadable
    ids = _launch(shared, nemo_python)
    tasks = sorted(task.state for task in slurm_cluster.wait_jobs(ids["encode_latents"], timeout=600))
    assert tasks == ["COMPLETED", "FAILED"]
    for name in ("latents_wdinfo", "data_check", "sd_860m_res_256"):
        assert slurm_cluster.wait_job(ids[name], timeout=60).state == "CANCELLED", name
    assert "00003.tar: truncated" in _log(shared, "data_preparation", "encode_latents")
