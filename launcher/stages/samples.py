"""samples: what a checkpoint draws for fixed prompts, as one labelled grid per checkpoint.

One single-GPU job (launcher/jobs/samples.py) converts the checkpoint with NeMo's own
convert_ckpt_to_nemo.py (the run's hparams.yaml, the EMA weights when training kept them), samples it
with NeMo's own sd_infer.py at the trained resolution with fixed prompts and seed, and writes
`<run>/samples/step_<N>/grid.png` and the training plot. Chosen with training it waits for the last
training part; alone it samples the run's newest finished checkpoint, or `samples.checkpoint`.

What differs by model family is the family's (launcher.families, `inference`): its samplers and scripts
(samples.sampler and samples.infer_script null: the family's own), and whether NeMo converts its
checkpoints. SDXL's it does not (convert_ckpt_to_nemo.py has no SDXL model type), so the job samples the
`.nemo` sd_xl_train.py saves at the end of training (or a given .nemo) with NeMo's sd_xl_infer.py; a
.ckpt is refused. A run trained from cached text embeddings (its .nemo holds no text encoders and its
conditioner reads stored embeddings, not prompts: docs/latents.md) is sampled from a copy of its .nemo with
the staged text encoders put back (the family's cache.restore): samples.json names the training
config before the switch (`<training config stem>_encode.yaml`), written with this stage's files so that it
exists where data preparation never ran, and the job writes the copy as `step_<N>/model.nemo`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher import nemo_config
from launcher.config import Runtime
from launcher.context import Context, Facts
from launcher.errors import ConfigError
from launcher.families import all_samplers
from launcher.outputs import SamplesOutputs
from launcher.paths import relative_to_run, run_dir_of
from launcher.rules import ABS_PATH, SLURM_MEM, Choice, Each, Pattern, Range, SlurmTime, Text, ruled
from launcher.sampling.resolution import trained_size
from launcher.sampling.settings import NAME_CHARS, SamplingSettings
from launcher.spec import JobSpec
from launcher.stage import StageSpec
from launcher.stages import sampled
from launcher.stages.common import gpu_task_resources, make_job, require_mounted
from launcher.stages.precache import encode_config_file

NAME = "samples"
JOB_NAME = "samples"
# NeMo saves each image as `<prompt[:50]>_<i>.png`: a '/' would name a folder.
PROMPT = Pattern(r"[^/\x00-\x1f]*[^/\x00-\x1f\s][^/\x00-\x1f]*", "text without '/' or control characters")
DEFAULT_PROMPTS = [
    "a red bicycle leaning against a brick wall",
    "a bowl of ramen on a wooden table, seen from above",
    "a lighthouse on a rocky coast at sunset",
    "a portrait photo of an old fisherman with a white beard",
    "a golden retriever puppy playing in fresh snow",
    "an oil painting of a village in the mountains",
    "a city street at night in the rain with neon signs",
    "a close-up photo of a sunflower with a bee on it",
]


@dataclass
class SamplesConfig:
    """Sampling one checkpoint with NeMo's inference for its model family (conf/samples/default.yaml)."""

    checkpoint: str | None = ruled(
        ABS_PATH,
        None,
        help="A training .ckpt to sample (SDXL: a .nemo); null = this run's newest finished checkpoint "
        "(SDXL: the .nemo saved at the end of training).",
    )
    prompts: list[str] = ruled(
        Each(PROMPT, min_items=1),
        factory=lambda: list(DEFAULT_PROMPTS),
        help="One grid row each; NeMo names each image after the first 50 characters.",
    )
    images_per_prompt: int = ruled(Range(1, 16), 4, help="Grid columns: images per prompt.")
    seed: int = ruled(
        Range(0, 2**31 - 1), 1234, help="Starting noise: the same at every checkpoint, so grids compare."
    )
    sampler: str | None = ruled(
        Choice(all_samplers()),
        None,
        help="NeMo's sampler, one of the trained model family's (SD: PLMS, DDIM, DPM; SDXL: sd_xl_infer's); "
        "null = the family's first (SD: PLMS, SDXL: EulerEDMSampler).",
    )
    steps: int = ruled(
        Range(1, 1000), 50, help="Sampling steps (PLMS/DDIM: a divisor of the 1000 timesteps)."
    )
    guidance_scale: float = ruled(Range(1, 30, integer=False), 7.5, help="Classifier-free guidance scale.")
    resolution: int | None = ruled(
        Range(64, 4096), None, help="null = the resolution the model was trained at (the only one allowed)."
    )
    batch_size: int = ruled(Range(1, 256), 8, help="Images generated at once.")
    precision: str = ruled(
        Choice(("16-mixed", "bf16-mixed", "32-true")),
        "16-mixed",
        help="Inference precision (trainer.precision).",
    )
    python: str = ruled(Text(), "python3", help="NeMo's interpreter in the container.")
    convert_script: str = ruled(
        Text(), "/opt/NeMo/examples/multimodal/convert_ckpt_to_nemo.py", help="NeMo's checkpoint conversion."
    )
    infer_script: str | None = ruled(
        Text(),
        None,
        help="NeMo's text-to-image inference; null = the trained model family's (SD: "
        "/opt/NeMo/examples/multimodal/text_to_image/stable_diffusion/sd_infer.py, SDXL: sd_xl_infer.py there).",
    )
    time_limit: str = ruled(SlurmTime(), "01:00:00", help="The samples job's time limit.")
    mem: str | None = ruled(
        SLURM_MEM, "64G", help="Memory of the one-GPU job (not the whole node's, unlike training's)."
    )


def _planned(ctx: Context) -> frozenset[str]:
    return frozenset(stage.name for stage in ctx.stages)


def unswitched_config(ctx: Context) -> tuple[Path, str] | None:
    """(path, text) of the training config before the switch, whose caption embedders the job puts back,
    when the sampled model was trained from cached text embeddings; else None."""
    return encode_config_file(ctx) if sampled.from_cached_text(ctx.cfg, _planned(ctx)) else None


def settings(ctx: Context) -> SamplingSettings:
    sc, inference = ctx.cfg.samples, sampled.family(ctx.cfg).inference
    unswitched = unswitched_config(ctx)
    return SamplingSettings(
        run_dir=str(ctx.run_dir),
        checkpoints_dir=str(sampled.checkpoints_dir(ctx.cfg)),
        checkpoint=sc.checkpoint,
        # NeMo's EMA weights are a training checkpoint's twin: what the conversion reads.
        ema=sampled.ema(ctx.cfg) and inference.converts_checkpoints,
        family=sampled.family(ctx.cfg).name,
        nemo_python=sc.python,
        convert_script=sc.convert_script,
        infer_script=sc.infer_script or inference.infer_script,
        plot_python=ctx.python,
        code_dir=ctx.code_dir,
        prompts=tuple(sampled.prompts(ctx.cfg).values()),
        images_per_prompt=sc.images_per_prompt,
        batch_size=sc.batch_size,
        seed=sc.seed,
        sampler=sampled.sampler(ctx.cfg, NAME),
        steps=sc.steps,
        guidance_scale=float(sc.guidance_scale),
        resolution=sc.resolution,
        precision=sc.precision,
        unswitched_config=str(unswitched[0]) if unswitched else None,
        program_inputs=sampled.program_inputs(ctx.cfg),
    )


def settings_path(run: Path) -> Path:
    return SamplesOutputs(run).settings


def plan(ctx: Context) -> tuple[JobSpec, ...]:
    argv = (ctx.cfg.samples.python, "-u", "-m", "launcher.jobs.samples", str(settings_path(ctx.run_dir)))
    job = make_job(
        ctx,
        stage=NAME,
        name=JOB_NAME,
        argv=argv,
        resources=gpu_task_resources(ctx, 1, ctx.cfg.samples.time_limit, ctx.cfg.samples.mem),
        env=nemo_config.OFFLINE_HUB_ENV,
        with_code=False,
    )
    return (job,)


def _files(ctx: Context) -> tuple[tuple[Path, str], ...]:
    unswitched = unswitched_config(ctx)
    return ((settings_path(ctx.run_dir), settings(ctx).to_json()), *((unswitched,) if unswitched else ()))


def _notes(ctx: Context) -> tuple[str, ...]:
    sc, s = ctx.cfg.samples, settings(ctx)
    converts = sampled.family(ctx.cfg).inference.converts_checkpoints
    newest = (
        "the newest finished training checkpoint" if converts else "the .nemo saved at the end of training"
    )
    restored = (
        f" with its text encoders put back (from {Path(s.unswitched_config).name}) in a sampling copy "
        f"{SamplesOutputs(ctx.run_dir).model('<N>')}"
        if s.unswitched_config
        else ""
    )
    return (
        f"samples: {len(s.prompts)} prompt(s) x {sc.images_per_prompt} image(s) of {sc.checkpoint or newest}"
        f"{' (EMA weights)' if s.ema else ''}{restored}, {s.sampler} {sc.steps} steps, seed {sc.seed}; "
        f"grid: {SamplesOutputs(ctx.run_dir).grid('<N>')}",
    )


def _check_steps(cfg: Any) -> None:
    """PLMS and DDIM take every (timesteps // steps)-th of the training timesteps from 0 and add 1
    (make_ddim_timesteps, diffusionmodules/util.py): unless steps divides timesteps, that runs more steps
    than asked, or indexes past the schedule (IndexError: 3 steps of 1000 reach 999 + 1)."""
    timesteps = int(cfg.training.model.get("timesteps", 1000))
    sc = cfg.samples
    if sampled.strided(cfg, NAME) and timesteps % sc.steps:
        divisors = [n for n in (10, 20, 25, 40, 50, 100, 125, 200, 250) if timesteps % n == 0]
        raise ConfigError(
            "samples.steps",
            f"{sc.steps} does not divide the model's {timesteps} timesteps, which {sampled.sampler(cfg, NAME)} "
            f"needs; allowed: a divisor such as {', '.join(map(str, divisors))}",
        )


def _check(cfg: Any, planned: frozenset[str]) -> None:
    """A sampler of the trained family, steps it can take, a checkpoint it can sample that the container
    sees, and prompts NeMo would save over each other (it names images by their first 50 characters)."""
    sampled.check_sampler(cfg, NAME)
    sampled.program_inputs(cfg)  # the family's own inputs, refused naming their key
    _check_steps(cfg)
    sampled.check_nemo_given(cfg)
    if cfg.samples.checkpoint and cfg.container.runtime is Runtime.pyxis:
        require_mounted("samples.checkpoint", cfg.samples.checkpoint, cfg.container.mounts)
    seen: dict[str, str] = {}
    for key, prompt in sampled.prompts(cfg).items():
        head = prompt[:NAME_CHARS]
        if head in seen:
            raise ConfigError(
                key,
                f"starts with the same {NAME_CHARS} characters as {seen[head]}: NeMo names each image after "
                "them and would write one over the other; allowed: prompts that differ within their first "
                f"{NAME_CHARS} characters",
            )
        seen[head] = key


def _host_check(cfg: Any, planned: frozenset[str], facts: Facts) -> None:
    """The checkpoint must exist now (or come from training planned with it), and the resolution be the
    one it was trained at."""
    trained_with, source = sampled.trained_model(cfg, planned)
    if sampled.from_cached_text(cfg, planned):
        check_restorable(cfg, planned, facts, trained_with, source)
    trained, wanted = trained_size(trained_with), cfg.samples.resolution
    if wanted is None and trained is None:
        raise ConfigError("samples.resolution", f"is null but {source} fixes no image size; allowed: a size")
    if wanted is not None and trained is not None and trained != (wanted, wanted):
        size = f"{trained[0]}x{trained[1]}"
        allowed = f"null or {trained[0]}" if trained[0] == trained[1] else "null"
        raise ConfigError(
            "samples.resolution",
            f"{wanted}: the model was trained at {size} ({source}); allowed: {allowed}",
        )


def check_restorable(
    cfg: Any, planned: frozenset[str], facts: Facts, model: dict[str, Any], source: str
) -> None:
    """The .nemo trained from cached text embeddings gets its text encoders back from the caption embedders
    of the training config before the switch, as this launch writes it: refused unless they switch to its
    own (the family's cache.restore.check, pure)."""
    import yaml

    ctx = Context(cfg=cfg, facts=facts, run_dir=run_dir_of(cfg))
    path, text = encode_config_file(ctx)
    sampled.check_restorable(cfg, model, source, yaml.safe_load(text), path.name)


def status_lines(run: Path) -> list[str]:
    """The newest grid (highest step) and how many checkpoints were sampled."""
    grids = SamplesOutputs(run).grids()
    if not grids:
        return []
    return [f"samples: newest grid {relative_to_run(grids[-1], run)} ({len(grids)} checkpoint(s) sampled)"]


STAGE = StageSpec(
    name=NAME,
    config=SamplesConfig,
    plan=plan,
    needs=lambda cfg: ("assets", "training"),
    check=_check,
    host_check=_host_check,
    files=_files,
    notes=_notes,
    status=status_lines,
)
