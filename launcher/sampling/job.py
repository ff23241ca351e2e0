"""The samples job: NeMo's own conversion and inference on one training checkpoint, then a labelled grid.

    <nemo python> <repo>/launcher/sampling/job.py <run>/samples/samples.json

Started by path with NeMo's interpreter, so NeMo keeps the image's PYTHONPATH (this file finds its own
package from its path). Steps, each a child process of NVIDIA's example scripts:
1. the checkpoint: samples.json's, else the run's newest finished one (its -EMA twin when EMA is on);
2. `convert_ckpt_to_nemo.py --model_type stable_diffusion` with the run's hparams.yaml -> model.nemo
   (skipped when a previous run of this job converted that same checkpoint: model.nemo.source);
3. `sd_infer.py` on a config written here (fixed prompts, seed, sampler, steps; the trained resolution);
4. grid.png, samples.json (what was sampled, how), and the training plot (`python -m launcher.plot`).
Everything lands in <run>/samples/step_<N>/; each file appears only once complete.

SDXL (settings.sdxl): steps 1-2 become the .nemo sd_xl_train.py saved at the end of training (or the given
.nemo; its step is that of the -last checkpoint saved just before it), and step 3 NeMo's sd_xl_infer.py,
which names its images `{n:09}.png` in prompt order.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # started by path: the checkout replaces this file's folder on sys.path
    sys.path[0] = str(next(p for p in Path(__file__).resolve().parents if not (p / "__init__.py").exists()))

from data_prep.atomic import atomic_path, write_atomic, write_json_atomic
from data_prep.faults import step_main
from launcher.checkpoints import (
    ema_twin,
    final_nemo,
    hparams_of,
    is_ema,
    nemo_model_config,
    newest,
    step_of,
    step_of_nemo,
)
from launcher.sampling.grid import grid_image
from launcher.sampling.resolution import trained_size
from launcher.sampling.settings import NAME_CHARS, SamplingSettings


def checkpoint_to_sample(s: SamplingSettings) -> Path:
    if s.checkpoint:
        given = Path(s.checkpoint)
        return ema_twin(given) if s.ema and ema_twin(given).exists() else given
    found = newest(Path(s.checkpoints_dir), s.ema)
    if found is None:
        kind = "EMA (-EMA.ckpt) " if s.ema else ""
        raise SystemExit(f"samples: no finished {kind}checkpoint in {s.checkpoints_dir}")
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def nemo_env() -> dict[str, str]:
    """A world of one process, as torchrun would describe it: the inference setup forces Lightning's
    TorchElasticEnvironment (parts/utils.py), which reads these, and conversion's initialize_distributed
    reads RANK, WORLD_SIZE and MASTER_*."""
    world = {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    return {**os.environ, **world, "MASTER_PORT": str(_free_port())}


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


def infer_section(s: Any, size: tuple[int, int], out: Path, **given: Any) -> dict[str, Any]:
    """The `infer` keys sd_infer.yaml and sd_fid_images.yaml share, every one given, from settings `s`
    (samples' or the evaluation's); `given` sets the keys that differ."""
    return {
        "num_images_per_prompt": 1,
        "batch_size": s.batch_size,
        "height": size[0],
        "width": size[1],
        "down_factor": 8,
        "inference_steps": s.steps,
        "sampler_type": s.sampler,
        "eta": 0,
        "output_type": "pil",
        "out_path": str(out),
        "seed": s.seed,
        **given,
    }


def inference_trainer(precision: str) -> dict[str, Any]:
    """One GPU per process, no logger."""
    return {"devices": 1, "num_nodes": 1, "accelerator": "gpu", "precision": precision, "logger": False}


def trainer_and_model(precision: str, nemo_file: Path) -> dict[str, Any]:
    """The trainer, and the .nemo to restore."""
    model = {"restore_from_path": str(nemo_file), "precision": precision}
    return {"trainer": inference_trainer(precision), "model": model}


def infer_config(s: SamplingSettings, size: tuple[int, int], nemo_file: Path, out: Path) -> dict:
    """sd_infer.yaml's keys (examples/.../stable_diffusion/conf/sd_infer.yaml), every one given."""
    infer = infer_section(
        s,
        size,
        out,
        unconditional_guidance_scale=s.guidance_scale,
        num_images_per_prompt=s.images_per_prompt,
        save_to_file=True,
        prompts=list(s.prompts),
    )
    return {"name": "stable-diffusion-samples", "infer": infer, **trainer_and_model(s.precision, nemo_file)}


def xl_infer_config(
    s: Any,
    size: tuple[int, int],
    nemo_file: Path,
    out: Path,
    *,
    prompts: Sequence[str],
    scale: float,
    seed: int,
    per_prompt: int,
) -> dict:
    """sd_xl_infer.yaml's keys (v2.4.0 examples/.../stable_diffusion/conf/sd_xl_infer.yaml), every one the
    script reads, from settings `s` (samples' or the evaluation's: sampler, steps, batch_size, precision);
    NVIDIA's values except those, the prompts, `per_prompt` images of each, the guidance scale (VanillaCFG's
    `sampling.base.scale`, get_guider_config in sdxl_pipeline.py), the trained size, and no refiner.
    sd_xl_infer draws prompt i's batch b with seed `infer.seed + 100 i + 200 b`."""
    height, width = size
    base = {
        "sampler": s.sampler,
        "width": width,
        "height": height,
        "steps": s.steps,
        "discretization": "LegacyDDPMDiscretization",
        "guider": "VanillaCFG",
        "thresholder": "None",
        "scale": scale,
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
        # The size conditioning: an image of the trained size, uncropped (as training saw it).
        "orig_width": width,
        "orig_height": height,
        "crop_coords_top": 0,
        "crop_coords_left": 0,
        "aesthetic_score": 5.0,
        "negative_aesthetic_score": 5.0,
    }
    # sd_xl_infer draws num_samples // num_samples_per_batch batches per prompt: a divisor, or images go missing.
    per_batch = max(n for n in range(1, per_prompt + 1) if per_prompt % n == 0 and n <= s.batch_size)
    infer = {
        "num_samples": per_prompt,
        "num_samples_per_batch": per_batch,
        "prompt": list(prompts),
        "negative_prompt": "",
        "seed": seed,
    }
    return {
        "trainer": inference_trainer(s.precision),
        "model": {"restore_from_path": str(nemo_file), "is_legacy": False},
        "infer": infer,
        "sampling": {"base": base},
        "use_refiner": False,
        "use_fp16": False,
        "out_path": str(out),
    }


def sample(s: SamplingSettings, size: tuple[int, int], nemo_file: Path, step_dir: Path) -> Path:
    """NeMo's sd_infer.py (SDXL: sd_xl_infer.py) into a fresh folder, which replaces images/ once every
    image is written."""
    from omegaconf import OmegaConf

    images, partial = step_dir / "images", step_dir / ".images.partial"
    shutil.rmtree(partial, ignore_errors=True)
    if s.sdxl:
        script = "sd_xl_infer"
        given = {
            "prompts": s.prompts,
            "scale": s.guidance_scale,
            "seed": s.seed,
            "per_prompt": s.images_per_prompt,
        }
        written = xl_infer_config(s, size, nemo_file, partial, **given)
    else:
        script, written = "sd_infer", infer_config(s, size, nemo_file, partial)
    config = step_dir / f"{script}.yaml"
    write_atomic(config, OmegaConf.to_yaml(OmegaConf.create(written)))
    argv = [s.nemo_python, "-u", s.infer_script, "--config-path", str(step_dir), "--config-name", config.name]
    _run(argv, f"sample (NeMo's {script}.py)")
    shutil.rmtree(images, ignore_errors=True)
    partial.rename(images)
    return images


def image_name(s: SamplingSettings, row: int, column: int) -> str:
    """What NeMo names an image: sd_infer after the prompt's start and its index; sd_xl_infer counts
    `{n:09}.png` over the prompts in order (perform_save_locally), each prompt's images together."""
    if s.sdxl:
        return f"{row * s.images_per_prompt + column:09}.png"
    return f"{s.prompts[row][:NAME_CHARS]}_{column}.png"


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


def sdxl_nemo(s: Any, job: str) -> Path:
    """The SDXL .nemo settings `s` (samples' or the evaluation's) name: `checkpoint`, else the one
    training saved at its end in `checkpoints_dir`."""
    nemo = Path(s.checkpoint) if s.checkpoint else final_nemo(Path(s.checkpoints_dir))
    if nemo is None:
        raise SystemExit(f"{job}: no .nemo in {s.checkpoints_dir} (sd_xl_train.py saves one at its end)")
    return nemo


def sdxl_model_config(nemo: Path) -> dict[str, Any]:
    """The model config stored in an SDXL .nemo, as plain containers."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.create(nemo_model_config(nemo)))  # type: ignore[return-value]


def sdxl_model(s: SamplingSettings) -> tuple[Path, int]:
    """The .nemo to sample (the given one, else the one training saved at its end) and its step."""
    nemo = sdxl_nemo(s, "samples")
    step = step_of_nemo(nemo)
    if step is None:
        raise SystemExit(f"samples: no finished checkpoint beside {nemo} gives its training step")
    return nemo, step


def converted_model(s: SamplingSettings, checkpoint: Path, step: int | None) -> Path:
    """The checkpoint as model.nemo in its step folder, converted unless a previous run of this job did."""
    out = s.outputs
    nemo_file, source = out.model(step), out.model_source(step)
    # Reused only for the very checkpoint it came from (another run's step N lands in the same folder).
    if not (nemo_file.exists() and source.exists() and source.read_text() == str(checkpoint)):
        source.unlink(missing_ok=True)
        convert(s, checkpoint, nemo_file)
        write_atomic(source, str(checkpoint))
    return nemo_file


@step_main("samples")
def main(argv: list[str]) -> int:
    s = SamplingSettings.from_json(Path(argv[0]).read_text())
    from omegaconf import OmegaConf

    if s.sdxl:
        checkpoint, step = sdxl_model(s)
        where = f"{checkpoint} (model_config.yaml)"
        model = sdxl_model_config(checkpoint)
    else:
        checkpoint = checkpoint_to_sample(s)
        step, where = step_of(checkpoint), str(hparams_of(checkpoint))
        model = OmegaConf.to_container(OmegaConf.load(where).cfg)
    out = s.outputs
    step_dir = out.step_dir(step)
    step_dir.mkdir(parents=True, exist_ok=True)
    print(f"samples: checkpoint {checkpoint} (step {step})", flush=True)
    trained = trained_size(model)
    size = (s.resolution, s.resolution) if s.resolution else trained
    if size is None:
        raise SystemExit(f"samples: {where} fixes no image size: set samples.resolution")
    nemo_file = checkpoint if s.sdxl else converted_model(s, checkpoint, step)
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
    }
    write_json_atomic(step_dir / "samples.json", record)
    print(f"samples: grid {out.grid(step)}", flush=True)
    write_plot(s)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
