"""SDXL's evaluation generator (Family.inference.program.generate), one task of the evaluation's generation
array in NeMo's interpreter (launcher/jobs/generate.py starts it). NeMo has no FID script for SDXL
(generate_fid_images.py builds MegatronLatentDiffusion), so each task runs NeMo's sd_xl_infer.py, as the
samples job does, with its scale and its share of the captions (split as generate_fid_images.py splits them)
as prompts, one image each. sd_xl_infer numbers its images `{n:09}.png` after what its folder already holds:
each task draws into an empty folder of its own, then the images take their captions' numbers. Caption n is
drawn from seed `seed + 100 n` (sd_xl_infer's seed for prompt i is `infer.seed + 100 i`), whichever task
draws it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from launcher.evaluation.settings import EvaluationSettings
from launcher.plugins.sdxl.infer import infer_config
from launcher.sampling.generation import evaluated_model, run_nemo, share

# sd_xl_infer's seed step between consecutive prompts (v2.4.0: `infer.seed + i * 100 + batchid * 200`).
SEED_STEP = 100


def task_config(
    s: EvaluationSettings,
    nemo: Path,
    size: tuple[int, int],
    task: int,
    captions: list[str],
    mine: range,
    out: Path,
) -> dict:
    """sd_xl_infer.yaml for this task: its scale, its captions as prompts, one image each."""
    return infer_config(
        s,
        size,
        nemo,
        out,
        prompts=[captions[n] for n in mine],
        scale=float(s.guidance_scales[task]),
        seed=s.seed + SEED_STEP * mine.start,
        per_prompt=1,
    )


def generate(s: EvaluationSettings, task: int, local: int) -> int:
    """NeMo's sd_xl_infer.py on this task's scale and share of the captions, one image each."""
    nemo, size, _ = evaluated_model(s)
    captions = [row["caption"] for row in json.loads(s.outputs.captions_json.read_text())]
    mine, scale = share(len(captions), s.tasks_per_node, local), s.guidance_scales[task]
    print(
        f"evaluation: task {task}.{local}: captions {mine.start}-{mine.stop - 1} at scale {scale}, {nemo} "
        f"at {size[1]}x{size[0]}",
        flush=True,
    )
    if not mine:  # fewer captions than tasks
        return 0
    drawn = s.outputs.images / f".drawn_{task}_{local}"
    shutil.rmtree(drawn, ignore_errors=True)
    config = task_config(s, nemo, size, task, captions, mine, drawn)
    done = run_nemo(s, config, f"sd_xl_infer_{task}_{local}", local)
    if done:
        return done
    images = [drawn / f"{k:09}.png" for k in range(len(mine))]
    missing = [path for path in images if not path.is_file()]
    if missing:
        raise SystemExit(f"evaluation: {Path(s.generate_script).name} wrote no {missing[0]}")
    s.outputs.images_for(scale).mkdir(parents=True, exist_ok=True)
    for path, n in zip(images, mine, strict=True):
        path.replace(s.outputs.image(scale, n))
    shutil.rmtree(drawn)
    return 0
