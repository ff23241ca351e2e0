"""NeMo's SDXL inference (`sd_xl_infer.py`, tests/nemo_cpu/sd_xl_infer_cpu.py) on CPU from a tiny SDXL model.

The 256 px SDXL preset, rendered as a launch does and made tiny (tests/nemo_cpu/tiny.py SDXL_OVERRIDES), is
trained 2 steps by NeMo's sd_xl_train on the demo's image tars; NeMo writes the `.nemo` at the end. Then
sd_xl_infer, in the world of one process the samples job gives NeMo (launcher.sampling.job.nemo_env, the
variables torchrun sets: plain python dies with KeyError 'LOCAL_RANK'), restores it strictly and writes
one image per prompt and sample, named `{n:09}.png` in prompt order. This is the inference step the SDXL
samples stage will run; the stage itself (job, grid) is not built yet.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from nemo_cpu.harness import REPO, SD_XL_TRAIN_CPU, render_training, run_sd_train
from nemo_cpu.tiny import SDXL_OVERRIDES
from omegaconf import OmegaConf
from PIL import Image

from launcher.sampling.job import nemo_env

pytestmark = pytest.mark.slow

PRESET = "sdxl_base_train_res_256_stage_1"
INFER_CPU = REPO / "tests/nemo_cpu/sd_xl_infer_cpu.py"
PROMPTS = ["a red bicycle leaning against a brick wall", "a lighthouse on a rocky coast at sunset"]
SAMPLES = 2


def infer_config(nemo_file: Path, out: Path, side: int) -> dict:
    """sd_xl_infer.yaml's keys (NeMo v2.4.0 examples/.../conf/sd_xl_infer.yaml), every one the script reads."""
    base = {
        "sampler": "EulerEDMSampler",
        "width": side,
        "height": side,
        "steps": 2,
        "discretization": "LegacyDDPMDiscretization",
        "guider": "VanillaCFG",
        "thresholder": "None",
        "scale": 5.0,
        "img2img_strength": 1.0,
        "sigma_min": 0.0292,
        "sigma_max": 14.6146,
        "rho": 3.0,
        "s_churn": 0.0,
        "s_tmin": 0.0,
        "s_tmax": 999.0,
        "s_noise": 1.0,
        "eta": 1.0,
        "order": 4,
        "orig_width": side,
        "orig_height": side,
        "crop_coords_top": 0,
        "crop_coords_left": 0,
        "aesthetic_score": 5.0,
        "negative_aesthetic_score": 5.0,
    }
    return {
        "trainer": {"devices": 1, "num_nodes": 1, "accelerator": "gpu", "precision": 32, "logger": False},
        "infer": {"num_samples": SAMPLES, "prompt": PROMPTS, "negative_prompt": "", "seed": 123},
        "sampling": {"base": base},
        "model": {"restore_from_path": str(nemo_file), "is_legacy": False},
        "use_refiner": False,
        "use_fp16": False,
        "out_path": str(out),
    }


def test_sd_xl_infer_writes_the_images_from_a_tiny_trained_sdxl_model(new_shared, nemo_python: str) -> None:
    shared = new_shared()
    (shared / "data_sdxl_256").symlink_to("data")
    steps = "training.trainer.max_steps=2"
    config = render_training(shared, PRESET, f"training=sdxl/{PRESET}", steps, tiny=SDXL_OVERRIDES)
    config = config.parent / f"{PRESET}.yaml"
    trained = run_sd_train(nemo_python, config, shared / "train.log", runner=SD_XL_TRAIN_CPU)
    assert trained.returncode == 0, trained.stderr[-4000:]
    nemo_file = next((config.parent / "results/checkpoints").glob("*.nemo"))
    side = int(OmegaConf.load(config).model.data.train.augmentations.resize_smallest_side)
    folder, out = shared / "infer", shared / "infer/images"
    folder.mkdir()
    (folder / "sd_xl_infer.yaml").write_text(OmegaConf.to_yaml(infer_config(nemo_file, out, side)))
    env = {**nemo_env(), "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    argv = [
        nemo_python,
        "-u",
        str(INFER_CPU),
        "--config-path",
        str(folder),
        "--config-name",
        "sd_xl_infer.yaml",
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=REPO, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    written = sorted(p.name for p in out.iterdir())
    assert written == [f"{n:09}.png" for n in range(len(PROMPTS) * SAMPLES)]
    sizes = {Image.open(out / name).size for name in written}
    assert sizes == {(side, side)}
    # Without the torchrun variables NeMo's inference setup fails as the notes say.
    bare = {k: v for k, v in env.items() if k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE")}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=REPO, env=bare, check=False)
    assert proc.returncode != 0 and "LOCAL_RANK" in proc.stdout + proc.stderr
