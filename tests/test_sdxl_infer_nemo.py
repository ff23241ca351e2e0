"""The samples and evaluation stages for SDXL with NeMo's own code on CPU: sd_xl_infer.py
(tests/nemo_cpu/sd_xl_infer_cpu.py) samples the `.nemo` a tiny SDXL training wrote, and the job grids its
images; the evaluation's generation tasks draw one image per COCO caption with it at each guidance scale.

The 256 px SDXL preset, rendered as a launch does and made tiny (tests/nemo_cpu/tiny.py SDXL_OVERRIDES), is
trained 2 steps by NeMo's sd_xl_train on the demo's image tars; NeMo writes the `.nemo` at the end (one
training for this module). Then `stages=[samples]` runs on the local backend: the job runs sd_xl_infer in
the world of one process it gives NeMo (launcher.sampling.world.nemo_env, the variables torchrun sets: plain
python dies with KeyError 'LOCAL_RANK', checked here too), which restores the model strictly and writes one
image per prompt and sample, `{n:09}.png` in prompt order; the job pairs them with the prompts in the grid.
The evaluation's generation then draws from the same `.nemo` for a COCO-shaped fixture's captions
(tests/coco_fixture.py) at two guidance scales.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from coco_fixture import make_coco
from fixtures.nemo import FAST_LR
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

from launcher import preview
from launcher.cli import compose_config, launch
from launcher.nemo_config import OFFLINE_HUB_ENV
from launcher.outputs import EvaluationOutputs
from launcher.sampling.grid import LABEL_W, PAD, TITLE_H
from launcher.sampling.world import nemo_env
from launcher.stages.samples import status_lines

pytestmark = pytest.mark.slow

PRESET = "sdxl_base_train_res_256_stage_1"
PROMPTS = ["a red bicycle leaning against a brick wall", "a lighthouse on a rocky coast at sunset"]
SAMPLES = 2
SIDE = 64  # SDXL_OVERRIDES' resize_smallest_side
CAPTIONS, SCALES = 4, (1.5, 7.5)


@pytest.fixture(scope="module")
def sdxl_trained(new_shared, nemo_python: str) -> Path:
    """A shared folder whose run PRESET holds a tiny SDXL model trained 2 steps, with its final .nemo."""
    shared = new_shared()
    (shared / "data_sdxl_256").symlink_to("data")
    steps = "training.trainer.max_steps=2"
    # FAST_LR: the zero-initialised output layers move, so that the prompt and the guidance scale matter.
    config = render_training(shared, PRESET, f"training=sdxl/{PRESET}", steps, *FAST_LR, tiny=SDXL_OVERRIDES)
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
                *samples_on_cpu(nemo_python, SD_XL_INFER_CPU),
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


def test_the_evaluation_draws_one_sd_xl_infer_image_per_caption_and_scale_at_the_trained_size(
    sdxl_trained: Path, nemo_python: str, tmp_path: Path
) -> None:
    """eval_generate's program, both array tasks, on the settings a launch writes. The score job is SD's
    (tests/test_evaluation_nemo.py runs it); with the stand-in Inception on these 64 px images it would
    take minutes on CPU (denormal floats), so it is not run here."""
    run = launch(
        compose_config(
            [
                f"cluster.shared_dir={sdxl_trained}",
                f"run_name={PRESET}",
                f"training=sdxl/{PRESET}",
                "stages=[evaluation]",
                "assets.enable=false",
                "dry_run=true",  # the scripts and evaluation.json, after every check on the real .nemo
                f"evaluation.coco_root={make_coco(tmp_path / 'coco')}",
                f"evaluation.num_images={CAPTIONS}",
                f"evaluation.guidance_scales=[{','.join(map(str, SCALES))}]",
                "evaluation.steps=2",
                "evaluation.precision=32-true",
                f"evaluation.python={nemo_python}",
                f"evaluation.generate_script={SD_XL_INFER_CPU}",
            ]
        )
    )
    out = EvaluationOutputs(run)
    # The dry run wrote its files into the run folder, or into its preview once the samples test launched
    # there (either order): they go where a launch writes them.
    written = preview.target(run) / out.settings.relative_to(run)
    out.stage_dir.mkdir(parents=True, exist_ok=True)
    if written != out.settings:
        shutil.copy(written, out.settings)
    captions_job = ["-m", "launcher.jobs.captions", "--coco-root", str(tmp_path / "coco")]
    captions_job += ["--num", str(CAPTIONS), "--seed", "2014", "--out", str(out.stage_dir)]
    subprocess.run([sys.executable, *captions_job], check=True, cwd=REPO, timeout=60)
    captions = [row["caption"] for row in json.loads(out.captions_json.read_text())]
    argv = [nemo_python, "-u", "-m", "launcher.jobs.generate", str(out.settings)]
    tasks = [  # the array's two tasks side by side, as the local backend runs them
        subprocess.Popen(
            argv,
            env={**os.environ, **OFFLINE_HUB_ENV, "SLURM_ARRAY_TASK_ID": str(task), "SLURM_LOCALID": "0"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=REPO,
        )
        for task in range(len(SCALES))
    ]
    logs = [task.communicate(timeout=600)[0] for task in tasks]
    pixels = {}
    for task, (scale, log) in enumerate(zip(SCALES, logs, strict=True)):
        assert tasks[task].returncode == 0, log[-4000:]
        assert "sd_xl_infer_cpu: running sd_xl_infer_main" in log
        # NeMo ran this task's scale (VanillaCFG's) on every caption in order, one image each.
        config = yaml.safe_load((out.configs / f"sd_xl_infer_{task}_0.yaml").read_text())
        assert config["sampling"]["base"]["scale"] == scale and config["infer"]["prompt"] == captions
        assert (config["infer"]["num_samples"], config["infer"]["seed"]) == (1, 2014)
        written = sorted(p.name for p in out.images_for(scale).iterdir())
        assert written == [f"image{n:06d}.png" for n in range(CAPTIONS)]  # as score.py reads them
        with Image.open(out.image(scale, 0)) as image:
            assert image.size == (SIDE, SIDE)  # the trained size
            pixels[scale] = image.tobytes()
    assert pixels[SCALES[0]] != pixels[SCALES[1]]  # the scale reached NeMo's guider
    assert [p.name for p in out.images.iterdir() if p.name.startswith(".")] == []  # sd_xl_infer's folders
