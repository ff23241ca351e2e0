"""The samples stage for SDXL with NeMo's own code on CPU: sd_xl_infer.py (tests/nemo_cpu/sd_xl_infer_cpu.py)
samples the `.nemo` a tiny SDXL training wrote, and the job grids its images.

The 256 px SDXL preset, rendered as a launch does and made tiny (tests/nemo_cpu/tiny.py SDXL_OVERRIDES), is
trained 2 steps by NeMo's sd_xl_train on the demo's image tars; NeMo writes the `.nemo` at the end (one
training for this module). Then `stages=[samples]` runs on the local backend: the job runs sd_xl_infer in
the world of one process it gives NeMo (launcher.sampling.job.nemo_env, the variables torchrun sets: plain
python dies with KeyError 'LOCAL_RANK', checked here too), which restores the model strictly and writes one
image per prompt and sample, `{n:09}.png` in prompt order; the job pairs them with the prompts in the grid.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from nemo_cpu.harness import (
    REPO,
    SD_XL_INFER_CPU,
    SD_XL_TRAIN_CPU,
    render_training,
    run_sd_train,
    samples_on_cpu,
)
from nemo_cpu.tiny import SDXL_OVERRIDES
from PIL import Image

from launcher.cli import compose_config, launch
from launcher.sampling.grid import LABEL_W, PAD, TITLE_H
from launcher.sampling.job import nemo_env
from launcher.stages.samples import status_lines

pytestmark = pytest.mark.slow

PRESET = "sdxl_base_train_res_256_stage_1"
PROMPTS = ["a red bicycle leaning against a brick wall", "a lighthouse on a rocky coast at sunset"]
SAMPLES = 2
SIDE = 64  # SDXL_OVERRIDES' resize_smallest_side


@pytest.fixture(scope="module")
def sdxl_trained(new_shared, nemo_python: str) -> Path:
    """A shared folder whose run PRESET holds a tiny SDXL model trained 2 steps, with its final .nemo."""
    shared = new_shared()
    (shared / "data_sdxl_256").symlink_to("data")
    steps = "training.trainer.max_steps=2"
    config = render_training(shared, PRESET, f"training=sdxl/{PRESET}", steps, tiny=SDXL_OVERRIDES)
    config = config.parent / f"{PRESET}.yaml"
    trained = run_sd_train(nemo_python, config, shared / "train.log", runner=SD_XL_TRAIN_CPU)
    assert trained.returncode == 0, trained.stderr[-4000:]
    assert list((config.parent / "results/checkpoints").glob("*.nemo"))
    return shared


def test_the_samples_stage_grids_what_sd_xl_infer_draws_from_the_final_nemo(
    sdxl_trained: Path, nemo_python: str
) -> None:
    run = launch(
        compose_config(
            [
                f"cluster.shared_dir={sdxl_trained}",
                f"run_name={PRESET}",
                f"training=sdxl/{PRESET}",
                *SDXL_OVERRIDES,
                "stages=[samples]",
                "assets.enable=false",
                *samples_on_cpu(nemo_python),
                "samples.steps=2",
                f"samples.images_per_prompt={SAMPLES}",
                f"samples.prompts=[{','.join(PROMPTS)}]",
                "samples.precision=32-true",
            ]
        )
    )
    log = next((run / "samples" / "logs").glob("samples_*.out")).read_text()
    assert "sd_xl_infer_cpu: running sd_xl_infer_main" in log and "convert (NeMo's" not in log
    step_dir = run / "samples" / "step_2"  # the -last checkpoint NeMo saved just before the .nemo
    record = json.loads((step_dir / "samples.json").read_text())
    assert record["checkpoint"].endswith(".nemo") and not record["ema"]
    assert (record["height"], record["width"], record["sampler"]) == (SIDE, SIDE, "EulerEDMSampler")
    written = sorted(p.name for p in (step_dir / "images").iterdir())
    assert written == [f"{n:09}.png" for n in range(len(PROMPTS) * SAMPLES)]
    with Image.open(step_dir / "images" / written[0]) as image:
        assert (
            image.size == (SIDE, SIDE) and len(set(image.get_flattened_data())) > 100
        )  # a picture, not a flat fill
    with Image.open(step_dir / "grid.png") as grid:
        assert grid.size == (
            LABEL_W + SAMPLES * (SIDE + PAD) + PAD,
            TITLE_H + len(PROMPTS) * (SIDE + PAD) + PAD,
        )
    assert status_lines(run) == ["samples: newest grid samples/step_2/grid.png (1 checkpoint(s) sampled)"]
    # The config the job wrote, without the torchrun variables: NeMo's inference setup fails as the notes say.
    env = {**nemo_env(), "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    bare = {k: v for k, v in env.items() if k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE")}
    argv = [
        nemo_python,
        "-u",
        str(SD_XL_INFER_CPU),
        "--config-path",
        str(step_dir),
        "--config-name",
        "sd_xl_infer.yaml",
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=REPO, env=bare, check=False)
    assert proc.returncode != 0 and "LOCAL_RANK" in proc.stdout + proc.stderr
