"""What the evaluation's generators share (SD's generate_fid in launcher/jobs/generate.py, a family's own
`inference.program.generate`, e.g. SDXL's in launcher/plugins/sdxl/generate.py): the model to generate
from and its trained size, each task's share of the captions, NeMo's script run on a written config in
this task's world of one process on its own GPU."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from data_prep.atomic import write_atomic
from launcher.checkpoints import hparams_of
from launcher.families import named
from launcher.sampling.models import nemo_to_sample, stored_model_config
from launcher.sampling.resolution import trained_size
from launcher.sampling.world import nemo_env


def share(count: int, parts: int, index: int) -> range:
    """generate_fid_images.py's split of `count` captions among a node's `parts` tasks: equal parts, the
    last taking the remainder.

    >>> [list(share(5, 2, i)) for i in (0, 1)]
    [[0, 1], [2, 3, 4]]
    """
    size = count // parts
    return range(index * size, count if index == parts - 1 else (index + 1) * size)


def task_env(local: int) -> dict[str, str]:
    """nemo_env, with this task's GPU alone visible when srun shows it the node's GPUs."""
    env = nemo_env()
    visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    if len(visible) > 1:
        env["CUDA_VISIBLE_DEVICES"] = visible[local % len(visible)]
    return env


def run_nemo(s: Any, config: dict[str, Any], name: str, local: int) -> int:
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


def evaluated_model(s: Any) -> tuple[Path, tuple[int, int], str]:
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
