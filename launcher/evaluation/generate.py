"""One task of the evaluation's generation array: NeMo's own generate_fid_images.py for one guidance scale.

    <nemo python> <repo>/launcher/evaluation/generate.py <run>/evaluation/evaluation.json

srun starts this once per GPU of each array task. NeMo's script picks the scale from SLURM_ARRAY_TASK_ID
and its share of the captions from SLURM_LOCALID and fid.ntasks_per_node; each task here is a world of
one process on its own GPU (the inference setup forces Lightning's TorchElasticEnvironment, which reads
WORLD_SIZE, RANK, ...). The model is the newest one the samples job converted (samples/step_<N>/
model.nemo), at the size its training used. Images: evaluation/images/<scale>/image<n:06d>.png.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):  # started by path: find this repo
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from data_prep.atomic import write_atomic
from data_prep.faults import step_main
from launcher.evaluation.settings import EvaluationSettings
from launcher.sampling.checkpoints import hparams_of
from launcher.sampling.job import infer_section, nemo_env, trainer_and_model
from launcher.sampling.resolution import trained_size


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


def task_env(local: int) -> dict[str, str]:
    """nemo_env, with this task's GPU alone visible when srun shows it the node's GPUs."""
    env = nemo_env()
    visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    if len(visible) > 1:
        env["CUDA_VISIBLE_DEVICES"] = visible[local % len(visible)]
    return env


@step_main("evaluation")
def main(argv: list[str]) -> int:
    from omegaconf import OmegaConf

    s = EvaluationSettings.from_json(Path(argv[0]).read_text())
    found = s.samples.newest_converted()
    if found is None:
        raise SystemExit(f"evaluation: no model.nemo the samples job converted under {s.samples.stage_dir}")
    nemo, checkpoint = found
    size = trained_size(OmegaConf.to_container(OmegaConf.load(hparams_of(checkpoint)).cfg))
    if size is None:
        raise SystemExit(f"evaluation: {hparams_of(checkpoint)} fixes no image size")
    task, local = os.environ.get("SLURM_ARRAY_TASK_ID", "0"), int(os.environ.get("SLURM_LOCALID", "0"))
    config = s.outputs.configs / f"generate_{task}_{local}.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(config, OmegaConf.to_yaml(OmegaConf.create(generate_config(s, nemo, size, local))))
    argv = [
        s.nemo_python,
        "-u",
        s.generate_script,
        "--config-path",
        str(config.parent),
        "--config-name",
        config.name,
    ]
    print(
        f"evaluation: task {task}.{local}: {nemo} (from {checkpoint.name}) at {size[1]}x{size[0]}", flush=True
    )
    return subprocess.run(argv, env=task_env(local), check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
