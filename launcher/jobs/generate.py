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
model family is asked of the family (settings.family, launcher.families): the program (`inference.program`,
its `generate` function; the model, the shares and the run: launcher/sampling/generation.py):

sd_infer (SD): NeMo's generate_fid_images.py, which picks the scale and the share itself (from
SLURM_ARRAY_TASK_ID, SLURM_LOCALID and fid.ntasks_per_node).

A family's own program (SDXL's: launcher/plugins/sdxl/generate.py) names its generator, which this job
calls with the settings, the task and this process's share, as it calls SD's here.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from data_prep.faults import step_main
from launcher.evaluation.settings import EvaluationSettings
from launcher.families.family import job_function
from launcher.sampling.generation import evaluated_model, run_nemo
from launcher.sampling.infer_config import infer_section, program, trainer_and_model


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


def generate_fid(s: EvaluationSettings, task: int, local: int) -> int:
    """NeMo's generate_fid_images.py, which picks its scale and its captions itself."""
    nemo, size, came_from = evaluated_model(s)
    print(f"evaluation: task {task}.{local}: {nemo}{came_from} at {size[1]}x{size[0]}", flush=True)
    return run_nemo(s, generate_config(s, nemo, size, local), f"generate_{task}_{local}", local)


@step_main("evaluation")
def main(argv: list[str]) -> int:
    s = EvaluationSettings.from_json(Path(argv[0]).read_text())
    task, local = int(os.environ.get("SLURM_ARRAY_TASK_ID", "0")), int(os.environ.get("SLURM_LOCALID", "0"))
    return job_function(program(s).generate)(s, task, local)  # type: ignore[no-any-return]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
