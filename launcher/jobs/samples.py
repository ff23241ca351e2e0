"""The samples job: NeMo's own conversion and inference on one training checkpoint, then a labelled grid.

    <nemo python> -u -m launcher.jobs.samples <run>/samples/samples.json    (in the checkout)

Steps, each a child process of NVIDIA's example scripts:
1. the checkpoint: samples.json's, else the run's newest finished one (its -EMA twin when EMA is on);
2. `convert_ckpt_to_nemo.py --model_type stable_diffusion` with the run's hparams.yaml -> model.nemo
   (skipped when a previous run of this job converted that same checkpoint: model.nemo.source);
3. `sd_infer.py` on a config written here (fixed prompts, seed, sampler, steps; the trained resolution);
4. grid.png, samples.json (what was sampled, how), and the training plot (`python -m launcher.plot`).
Everything lands in <run>/samples/step_<N>/; each file appears only once complete.

What differs by model family is asked of the family (settings.family, launcher.families): a family whose
checkpoints NeMo does not convert (`inference.converts_checkpoints`, SDXL's) has steps 1-2 become the .nemo
training saved at its end (or the given .nemo; its step is that of the -last checkpoint saved just before
it); the program whose config step 3 writes is the family's `inference.program`: sd_infer, or sd_xl_infer
(SDXL's), which names its images `{n:09}.png` in prompt order. A .nemo trained from cached text embeddings
(its stored precache_mode) holds no text encoders: step 2 becomes a copy of it with the caption embedders of
settings.unswitched_config and their staged weights put back (the family's cache.restore; SDXL's:
launcher/plugins/sdxl/text_encoders.py), written
as model.nemo (model.nemo.source: the .nemo it came from; reused as a converted model is), and the
evaluation generates from that copy. A LoRA run's checkpoint (or .nemo: its adapters, NeMo's inference reads
none) is first made the whole model it trained, the adapters merged into the base weights
(launcher/sampling/lora_merge.py, in step_<N>/merged/, or as model.nemo itself for a .nemo), then sampled
as any other.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from data_prep.atomic import atomic_path, write_atomic, write_json_atomic
from data_prep.faults import step_main
from launcher.checkpoints import (
    chosen,
    hparams_of,
    is_ema,
    none_finished,
    step_of,
    step_of_nemo,
)
from launcher.families import as_planned, named
from launcher.families.family import CacheRestore, job_function
from launcher.jobs.nemo_cpu import patch_for_cpu
from launcher.sampling.grid import grid_image
from launcher.sampling.infer_config import program
from launcher.sampling.lora_merge import is_lora, merged_checkpoint, merged_nemo
from launcher.sampling.models import nemo_to_sample, stored_model_config
from launcher.sampling.nemo_archive import rewritten_path
from launcher.sampling.resolution import trained_size
from launcher.sampling.settings import NAME_CHARS, SamplingSettings
from launcher.sampling.world import nemo_env


def checkpoint_to_sample(s: SamplingSettings) -> Path:
    found = chosen(Path(s.checkpoints_dir), s.checkpoint, s.ema)
    if found is None:
        raise SystemExit(f"samples: {none_finished(Path(s.checkpoints_dir), s.ema)}")
    return found


def _run(argv: list[str], what: str) -> None:
    print(f"samples: {what}: {' '.join(argv)}", flush=True)
    done = subprocess.run(argv, env=nemo_env(), check=False)
    if done.returncode != 0:
        raise SystemExit(f"samples: {what} failed (exit {done.returncode})")


def convert(s: SamplingSettings, checkpoint: Path, nemo_file: Path) -> None:
    # NeMo's save_to writes in place: a temporary name, renamed once complete.
    with atomic_path(nemo_file) as tmp:
        partial = tmp.with_name(tmp.name + ".nemo")
        argv = [
            s.nemo_python,
            "-u",
            s.convert_script,
            "--checkpoint_folder",
            str(checkpoint.parent),
            "--checkpoint_name",
            checkpoint.name,
            "--hparams_file",
            str(hparams_of(checkpoint)),
            "--nemo_file_path",
            str(partial),
            "--model_type",
            "stable_diffusion",
        ]
        try:
            _run(argv, "convert (NeMo's convert_ckpt_to_nemo.py)")
            partial.replace(tmp)
        finally:
            partial.unlink(missing_ok=True)


def sample(s: SamplingSettings, size: tuple[int, int], nemo_file: Path, step_dir: Path) -> Path:
    """NeMo's inference script (sd_infer.py, SDXL's sd_xl_infer.py) into a fresh folder, which replaces
    images/ once every image is written."""
    from omegaconf import OmegaConf

    images, partial = step_dir / "images", step_dir / ".images.partial"
    shutil.rmtree(partial, ignore_errors=True)
    script = program(s)
    written = job_function(script.config)(s, size, nemo_file, partial)
    config = step_dir / f"{script.name}.yaml"
    write_atomic(config, OmegaConf.to_yaml(OmegaConf.create(written)))
    argv = [s.nemo_python, "-u", s.infer_script, "--config-path", str(step_dir), "--config-name", config.name]
    _run(argv, f"sample (NeMo's {script.name}.py)")
    shutil.rmtree(images, ignore_errors=True)
    partial.rename(images)
    return images


def image_named_by_prompt(s: SamplingSettings, row: int, column: int) -> str:
    """What sd_infer names an image: after the prompt's start and its index."""
    return f"{s.prompts[row][:NAME_CHARS]}_{column}.png"


def image_name(s: SamplingSettings, row: int, column: int) -> str:
    """The name the family's inference script gives an image (its program's `image_name`)."""
    return job_function(program(s).image_name)(s, row, column)  # type: ignore[no-any-return]


def image_rows(s: SamplingSettings, images: Path) -> list[tuple[str, list[Path]]]:
    rows = []
    for row, prompt in enumerate(s.prompts):
        paths = [images / image_name(s, row, column) for column in range(s.images_per_prompt)]
        missing = [p.name for p in paths if not p.exists()]
        if missing:
            raise SystemExit(f"samples: {Path(s.infer_script).name} wrote no {missing[0]} in {images}")
        rows.append((prompt, paths))
    return rows


def write_plot(s: SamplingSettings) -> None:
    """The training curves beside the samples; a run without events yet is reported, not fatal."""
    env = {**os.environ, "PYTHONPATH": s.code_dir}
    argv = [s.plot_python, "-m", "launcher.plot", s.run_dir]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    print(f"samples: training plot: {(done.stdout + done.stderr).strip()}", flush=True)


def nemo_and_step(s: SamplingSettings) -> tuple[Path, int]:
    """The .nemo to sample (the given one, else the one training saved at its end) and its step."""
    nemo = nemo_to_sample(s, "samples")
    step = step_of_nemo(nemo)
    if step is None:
        raise SystemExit(f"samples: no finished checkpoint beside {nemo} gives its training step")
    return nemo, step


def made_from(target: Path, came_from: Path, make: Callable[[], Any]) -> Path:
    """`target`, written by `make()` unless a previous run of this job made it from that very file
    (<target>.source names it: another run's step N lands in the same folder)."""
    source = target.with_name(target.name + ".source")
    if not (target.exists() and source.exists() and source.read_text() == str(came_from)):
        source.unlink(missing_ok=True)
        make()
        write_atomic(source, str(came_from))
    return target


def made_once(s: SamplingSettings, came_from: Path, step: int | None, make: Callable[[Path], Any]) -> Path:
    """model.nemo in its step folder, made from `came_from` by `make(model.nemo)` (made_from)."""
    nemo_file = s.outputs.model(step)
    return made_from(nemo_file, came_from, lambda: make(nemo_file))


def _nemo_on_this_node() -> None:
    """The merge builds NeMo's model in this process: on a node without a GPU (a CPU partition, the local
    backend), with nemo_cpu's replacements of its CUDA-only calls, as the rehearsal does."""
    import torch

    if not torch.cuda.is_available():
        for line in patch_for_cpu():
            print(f"samples: patched {line}", flush=True)


def merged_model(s: SamplingSettings, checkpoint: Path, step: int | None, model: dict[str, Any]) -> Path:
    """A LoRA run's checkpoint (or .nemo) as the whole merged model, in its step folder's `merged/`
    (launcher/sampling/lora_merge.py; made_from)."""
    folder = s.outputs.step_dir(step) / "merged"
    target = rewritten_path(folder, checkpoint) if checkpoint.suffix == ".ckpt" else folder / "model.nemo"

    def merge() -> None:
        print(
            f"samples: LoRA: the adapters of {checkpoint} merged into its base weights -> {target}",
            flush=True,
        )
        _nemo_on_this_node()
        if checkpoint.suffix == ".ckpt":
            merged_checkpoint(checkpoint, model, folder)
        else:
            merged_nemo(checkpoint, model, target)

    return made_from(target, checkpoint, merge)


def model_checkpoint(
    s: SamplingSettings, rewrite: str, checkpoint: Path, step: int | None, model: dict[str, Any]
) -> tuple[Path, dict[str, Any]]:
    """The training checkpoint rewritten by its family as the model the conversion builds
    (Inference.checkpoint_as_model), in its step folder's `model/` (made_from), and that model's config."""
    from omegaconf import OmegaConf

    folder = s.outputs.step_dir(step) / "model"
    target = rewritten_path(folder, checkpoint)

    def rewritten() -> None:
        print(f"samples: {checkpoint} rewritten as the model NeMo converts -> {target}", flush=True)
        job_function(rewrite)(checkpoint, model, folder)

    made_from(target, checkpoint, rewritten)
    return target, OmegaConf.to_container(OmegaConf.load(hparams_of(target)).cfg)  # type: ignore[return-value]


def converted_model(s: SamplingSettings, checkpoint: Path, step: int | None) -> Path:
    """The checkpoint as model.nemo in its step folder, converted unless a previous run of this job did."""
    return made_once(s, checkpoint, step, lambda nemo_file: convert(s, checkpoint, nemo_file))


def restored_model(s: SamplingSettings, restore: CacheRestore, nemo: Path, step: int) -> Path:
    """A copy of `nemo` (trained from cached text embeddings) with its text encoders back (the family's
    cache.restore), as model.nemo in its step folder, written unless a previous run of this job did so from
    that same .nemo."""
    if not s.unswitched_config:
        raise SystemExit(
            f"samples: {nemo} was trained from cached text embeddings and samples.json names no training "
            "config before the switch (planned for another model): launch the samples stage again"
        )
    config = Path(s.unswitched_config)

    def make(nemo_file: Path) -> None:
        print(f"samples: text encoders: the caption embedders of {config} into {nemo_file}", flush=True)
        restore.write(nemo, config, nemo_file)

    return made_once(s, nemo, step, make)


@step_main("samples")
def main(argv: list[str]) -> int:
    s = SamplingSettings.from_json(Path(argv[0]).read_text())
    from omegaconf import OmegaConf

    converts = named(s.family).inference.converts_checkpoints
    if converts:
        checkpoint = checkpoint_to_sample(s)
        step, where = step_of(checkpoint), str(hparams_of(checkpoint))
        model = OmegaConf.to_container(OmegaConf.load(where).cfg)
    else:
        checkpoint, step = nemo_and_step(s)
        where = f"{checkpoint} (model_config.yaml)"
        model = stored_model_config(checkpoint)
    out = s.outputs
    step_dir = out.step_dir(step)
    step_dir.mkdir(parents=True, exist_ok=True)
    family = as_planned(model, s.family)  # a plugin's family found here as the planner found it
    print(f"samples: checkpoint {checkpoint} (step {step}), a {family.title} model, {s.sampler}", flush=True)
    trained = trained_size(model)
    size = (s.resolution, s.resolution) if s.resolution else trained
    if size is None:
        raise SystemExit(f"samples: {where} fixes no image size: set samples.resolution")
    trained_as, rewrite = checkpoint, family.inference.checkpoint_as_model
    if converts and rewrite:
        trained_as, model = model_checkpoint(s, rewrite, checkpoint, step, model)
    restore = job_function(family.cache.restore) if family.cache.restore else None
    restored = restore is not None and restore.needed(model)
    lora_nemo = is_lora(model) and not converts and not restored
    sampled = merged_model(s, trained_as, step, model) if is_lora(model) and not lora_nemo else trained_as
    if converts:
        nemo_file = converted_model(s, sampled, step)
    elif restored:
        nemo_file = restored_model(s, restore, sampled, step)  # type: ignore[arg-type]
    elif lora_nemo:  # merged as model.nemo itself, which the evaluation then generates from
        _nemo_on_this_node()
        nemo_file = made_once(s, checkpoint, step, lambda out: merged_nemo(checkpoint, model, out))
    else:
        nemo_file = sampled
    images = sample(s, size, nemo_file, step_dir)
    title = (
        f"{Path(s.run_dir).name}  step {step}{'  EMA' if is_ema(checkpoint) else ''}  {s.sampler} {s.steps} steps  "
        f"guidance {s.guidance_scale}  seed {s.seed}  {size[1]}x{size[0]}"
    )
    with atomic_path(out.grid(step)) as tmp:
        grid_image(image_rows(s, images), title).save(tmp, format="PNG")
    record = {
        "checkpoint": str(checkpoint),
        "step": step,
        "ema": is_ema(checkpoint),
        "height": size[0],
        "width": size[1],
        "prompts": list(s.prompts),
        "images_per_prompt": s.images_per_prompt,
        "seed": s.seed,
        "sampler": s.sampler,
        "steps": s.steps,
        "guidance_scale": s.guidance_scale,
        "precision": s.precision,
        "model": str(nemo_file),  # what NeMo restored: the checkpoint's .nemo, or a copy made here
    }
    write_json_atomic(step_dir / "samples.json", record)
    print(f"samples: grid {out.grid(step)}", flush=True)
    write_plot(s)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
