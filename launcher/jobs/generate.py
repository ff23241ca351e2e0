"""One task of the evaluation's generation array: NeMo's own inference for one guidance scale.

    <nemo python> -u -m launcher.jobs.generate <run>/evaluation/evaluation.json    (in the checkout)

srun starts this once per GPU of each array task; each is a world of one process on its own GPU (the
inference setup forces Lightning's TorchElasticEnvironment, which reads WORLD_SIZE, RANK, ...). The array
task is the guidance scale, SLURM_LOCALID this process's share of the captions. Images:
evaluation/images/<scale>/image<n:06d>.png, n the caption's number, at the size the model was trained at.

The model (settings.from_samples, decided at planning time): the model the samples job made sampleable
last, samples/step_<N>/model.nemo, for a checkpoint it converts (its training's hparams.yaml giving the
size) or a .nemo trained from cached text embeddings (the copy with its text encoders back; size: its
model_config.yaml); else the .nemo the samples stage samples (size: its model_config.yaml). What differs by
model family is asked of the family (settings.family, launcher.families): the program (`inference.program`):

sd_infer (SD): NeMo's generate_fid_images.py, which picks the scale and the share itself (from
SLURM_ARRAY_TASK_ID, SLURM_LOCALID and fid.ntasks_per_node).

sd_xl_infer (SDXL): NeMo has no FID script for SDXL (generate_fid_images.py builds MegatronLatentDiffusion),
so each task runs NeMo's sd_xl_infer.py, as the samples job does, with its scale and its share of the
captions (split as generate_fid_images.py splits them) as prompts, one image each. sd_xl_infer numbers its
images `{n:09}.png` after what its folder already holds: each task draws into an empty folder of its own,
then the images take their captions' numbers. Caption n is drawn from seed `seed + 100 n` (sd_xl_infer's
seed for prompt i is `infer.seed + 100 i`), whichever task draws it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from data_prep.atomic import write_atomic
from data_prep.faults import step_main
from launcher.checkpoints import hparams_of
from launcher.evaluation.settings import EvaluationSettings
from launcher.families import named
from launcher.families.family import job_function
from launcher.jobs.samples import nemo_env, nemo_to_sample, stored_model_config
from launcher.sampling.infer_config import infer_section, program, trainer_and_model, xl_infer_config
from launcher.sampling.resolution import trained_size

# sd_xl_infer's seed step between consecutive prompts (v2.4.0: `infer.seed + i * 100 + batchid * 200`).
XL_INFER_SEED_STEP = 100


def share(count: int, parts: int, index: int) -> range:
    """generate_fid_images.py's split of `count` captions among a node's `parts` tasks: equal parts, the
    last taking the remainder.

    >>> [list(share(5, 2, i)) for i in (0, 1)]
    [[0, 1], [2, 3, 4]]
    """
    size = count // parts
    return range(index * size, count if index == parts - 1 else (index + 1) * size)


def generate_config(s: EvaluationSettings, nemo: Path, size: tuple[int, int], local: int) -> dict:
    """sd_fid_images.yaml's keys (examples/.../stable_diffusion/conf/sd_fid_images.yaml), every one given;
    one device per process: each task is its own world (see the module docstring)."""
    fid = {
        "classifier_free_guidance": [float(g) for g in s.guidance_scales],
        "nnodes_per_cfg": 1,
        "ntasks_per_node": s.tasks_per_node,
        "local_task_id": local,
        "num_images_to_eval": s.num_images,
        "coco_captions_path": str(s.outputs.captions_dir),
        "coco_images_path": str(Path(s.coco_root) / "val2014"),
        "save_path": str(s.outputs.images),
    }
    # The scale is NeMo's to set (per array task); it saves the images itself, named by caption.
    infer = infer_section(
        s, size, s.outputs.images, unconditional_guidance_scale=None, save_to_file=False, prompts=None
    )
    return {
        "name": "stable-diffusion-fid",
        "fid": fid,
        "infer": infer,
        **trainer_and_model(s.precision, nemo),
    }


def xl_task_config(
    s: EvaluationSettings,
    nemo: Path,
    size: tuple[int, int],
    task: int,
    captions: list[str],
    mine: range,
    out: Path,
) -> dict:
    """sd_xl_infer.yaml for this task: its scale, its captions as prompts, one image each."""
    return xl_infer_config(
        s,
        size,
        nemo,
        out,
        prompts=[captions[n] for n in mine],
        scale=float(s.guidance_scales[task]),
        seed=s.seed + XL_INFER_SEED_STEP * mine.start,
        per_prompt=1,
    )


def task_env(local: int) -> dict[str, str]:
    """nemo_env, with this task's GPU alone visible when srun shows it the node's GPUs."""
    env = nemo_env()
    visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    if len(visible) > 1:
        env["CUDA_VISIBLE_DEVICES"] = visible[local % len(visible)]
    return env


def run_nemo(s: EvaluationSettings, config: dict[str, Any], name: str, local: int) -> int:
    """NeMo's script on `config`, written as configs/<name>.yaml."""
    from omegaconf import OmegaConf

    path = s.outputs.configs / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, OmegaConf.to_yaml(OmegaConf.create(config)))
    argv = [
        s.nemo_python,
        "-u",
        s.generate_script,
        "--config-path",
        str(path.parent),
        "--config-name",
        path.name,
    ]
    return subprocess.run(argv, env=task_env(local), check=False).returncode


def evaluated_model(s: EvaluationSettings) -> tuple[Path, tuple[int, int], str]:
    """The .nemo to generate from, the size it was trained at, and where it came from: the model the
    samples job made sampleable last (settings.from_samples: converted, or with its text encoders back),
    else the .nemo the samples stage samples."""
    from omegaconf import OmegaConf

    if s.from_samples:
        found = s.samples.newest_converted()
        if found is None:
            raise SystemExit(f"evaluation: no model.nemo the samples job wrote under {s.samples.stage_dir}")
        nemo, checkpoint = found
        came_from = f" (from {checkpoint.name})"
        if named(s.family).inference.converts_checkpoints:
            where = str(hparams_of(checkpoint))
            model = OmegaConf.to_container(OmegaConf.load(where).cfg)
        else:
            where, model = f"{nemo} (model_config.yaml)", stored_model_config(nemo)
    else:
        nemo = nemo_to_sample(s, "evaluation")
        where, came_from = f"{nemo} (model_config.yaml)", ""
        model = stored_model_config(nemo)
    size = trained_size(model)  # type: ignore[arg-type]
    if size is None:
        raise SystemExit(f"evaluation: {where} fixes no image size")
    return nemo, size, came_from


def generate_fid(s: EvaluationSettings, task: int, local: int) -> int:
    """NeMo's generate_fid_images.py, which picks its scale and its captions itself."""
    nemo, size, came_from = evaluated_model(s)
    print(f"evaluation: task {task}.{local}: {nemo}{came_from} at {size[1]}x{size[0]}", flush=True)
    return run_nemo(s, generate_config(s, nemo, size, local), f"generate_{task}_{local}", local)


def generate_with_infer(s: EvaluationSettings, task: int, local: int) -> int:
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
    config = xl_task_config(s, nemo, size, task, captions, mine, drawn)
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


@step_main("evaluation")
def main(argv: list[str]) -> int:
    s = EvaluationSettings.from_json(Path(argv[0]).read_text())
    task, local = int(os.environ.get("SLURM_ARRAY_TASK_ID", "0")), int(os.environ.get("SLURM_LOCALID", "0"))
    return job_function(program(s).generate)(s, task, local)  # type: ignore[no-any-return]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
