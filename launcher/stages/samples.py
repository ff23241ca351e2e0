"""samples: what a checkpoint draws for fixed prompts, as one labelled grid per checkpoint.

One single-GPU job (launcher/sampling/job.py) converts the checkpoint with NeMo's own
convert_ckpt_to_nemo.py (the run's hparams.yaml, the EMA weights when training kept them), samples it
with NeMo's own sd_infer.py at the trained resolution with fixed prompts and seed, and writes
`<run>/samples/step_<N>/grid.png` and the training plot. Chosen with training it waits for the last
training part; alone it samples the run's newest finished checkpoint, or `samples.checkpoint`.

SDXL (data_prep.model_family): convert_ckpt_to_nemo.py has no SDXL model type, so the job samples the
`.nemo` sd_xl_train.py saves at the end of training (or a given .nemo) with NeMo's sd_xl_infer.py; a
.ckpt is refused. A run trained from cached text embeddings is refused too: its .nemo holds no text
encoders and its conditioner reads stored embeddings, not prompts (docs/latents.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data_prep.model_family import is_sdxl
from data_prep.text_cache import PRECACHE_MODE
from launcher import checkpoints, latents, nemo_config
from launcher.config import Runtime
from launcher.context import Context, Facts
from launcher.errors import ConfigError
from launcher.outputs import SamplesOutputs, TrainingOutputs
from launcher.paths import relative_to_run, run_dir_of
from launcher.rules import ABS_PATH, SLURM_MEM, Choice, Each, Pattern, Range, SlurmTime, Text, ruled
from launcher.sampling.resolution import trained_size
from launcher.sampling.settings import NAME_CHARS, SamplingSettings
from launcher.spec import JobSpec, Resources
from launcher.stage import StageSpec
from launcher.stages.common import make_job, require_mounted

NAME = "samples"
JOB_NAME = "samples"
# NeMo saves each image as `<prompt[:50]>_<i>.png`: a '/' would name a folder.
PROMPT = Pattern(r"[^/\x00-\x1f]*[^/\x00-\x1f\s][^/\x00-\x1f]*", "text without '/' or control characters")
# Where the training planned in this launch fixes the size (trained_model's source).
PLANNED_MODEL = "training.model.data.train.augmentations"
# get_sampler_config in NeMo v2.4.0's parts/stable_diffusion/sdxl_pipeline.py.
SDXL_SAMPLERS = (
    "EulerEDMSampler",
    "HeunEDMSampler",
    "EulerAncestralSampler",
    "DPMPP2SAncestralSampler",
    "DPMPP2MSampler",
    "LinearMultistepSampler",
)
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
    """Sampling one checkpoint with NeMo's sd_infer.py (conf/samples/default.yaml)."""

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
    sampler: str = ruled(
        Choice(("PLMS", "DDIM", "DPM")), "PLMS", help="NeMo's SD sampler (sd_infer's infer.sampler_type)."
    )
    sdxl_sampler: str = ruled(
        Choice(SDXL_SAMPLERS),
        "EulerEDMSampler",
        help="NeMo's SDXL sampler (sd_xl_infer's sampling.base.sampler), for SDXL presets.",
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
    infer_script: str = ruled(
        Text(),
        "/opt/NeMo/examples/multimodal/text_to_image/stable_diffusion/sd_infer.py",
        help="NeMo's text-to-image inference.",
    )
    sdxl_infer_script: str = ruled(
        Text(),
        "/opt/NeMo/examples/multimodal/text_to_image/stable_diffusion/sd_xl_infer.py",
        help="NeMo's SDXL text-to-image inference, for SDXL presets.",
    )
    time_limit: str = ruled(SlurmTime(), "01:00:00", help="The samples job's time limit.")
    mem: str | None = ruled(
        SLURM_MEM, "64G", help="Memory of the one-GPU job (not the whole node's, unlike training's)."
    )


def _ema(cfg: Any) -> bool:
    return bool((cfg.training.exp_manager.get("ema") or {}).get("enable"))


def checkpoints_dir(cfg: Any) -> Path:
    return TrainingOutputs(run_dir_of(cfg)).checkpoints


def sampler_for(cfg: Any, section: Any) -> str:
    """The sampler a stage's section (samples, evaluation) names for the trained family."""
    return section.sdxl_sampler if is_sdxl(cfg.training.model) else section.sampler


def settings(ctx: Context) -> SamplingSettings:
    sc = ctx.cfg.samples
    sdxl = is_sdxl(ctx.cfg.training.model)
    return SamplingSettings(
        run_dir=str(ctx.run_dir),
        checkpoints_dir=str(checkpoints_dir(ctx.cfg)),
        checkpoint=sc.checkpoint,
        ema=_ema(ctx.cfg) and not sdxl,
        sdxl=sdxl,
        nemo_python=sc.python,
        convert_script=sc.convert_script,
        infer_script=sc.sdxl_infer_script if sdxl else sc.infer_script,
        plot_python=ctx.python,
        code_dir=ctx.code_dir,
        prompts=tuple(sc.prompts),
        images_per_prompt=sc.images_per_prompt,
        batch_size=sc.batch_size,
        seed=sc.seed,
        sampler=sampler_for(ctx.cfg, ctx.cfg.samples),
        steps=sc.steps,
        guidance_scale=float(sc.guidance_scale),
        resolution=sc.resolution,
        precision=sc.precision,
    )


def settings_path(run: Path) -> Path:
    return SamplesOutputs(run).settings


def _resources(ctx: Context) -> Resources:
    cl = ctx.cfg.cluster
    gpus = 1 if cl.gpus_per_node >= 1 else None  # a cluster without GPUs (local) samples on CPU
    cpus = max(cl.cpus_per_node // max(cl.gpus_per_node, 1), 1) if cl.cpus_per_node else 1
    return Resources(
        nodes=1,
        ntasks_per_node=1,
        cpus_per_task=cpus,
        gpus_per_node=gpus,
        mem=ctx.cfg.samples.mem,
        time=ctx.cfg.samples.time_limit,
        partition=cl.partition,
    )


def plan(ctx: Context) -> tuple[JobSpec, ...]:
    program = f"{ctx.code_dir}/launcher/sampling/job.py"
    argv = (ctx.cfg.samples.python, "-u", program, str(settings_path(ctx.run_dir)))
    job = make_job(
        ctx,
        stage=NAME,
        name=JOB_NAME,
        argv=argv,
        resources=_resources(ctx),
        env=nemo_config.OFFLINE_HUB_ENV,
        with_code=False,
    )
    return (job,)


def _files(ctx: Context) -> tuple[tuple[Path, str], ...]:
    return ((settings_path(ctx.run_dir), settings(ctx).to_json()),)


def _notes(ctx: Context) -> tuple[str, ...]:
    sc, s = ctx.cfg.samples, settings(ctx)
    newest = "the .nemo saved at the end of training" if s.sdxl else "the newest finished training checkpoint"
    return (
        f"samples: {len(sc.prompts)} prompt(s) x {sc.images_per_prompt} image(s) of {sc.checkpoint or newest}"
        f"{' (EMA weights)' if s.ema else ''}, {s.sampler} {sc.steps} steps, seed {sc.seed}; "
        f"grid: {SamplesOutputs(ctx.run_dir).grid('<N>')}",
    )


def _check_steps(cfg: Any) -> None:
    """PLMS and DDIM take every (timesteps // steps)-th of the training timesteps from 0 and add 1
    (make_ddim_timesteps, diffusionmodules/util.py): unless steps divides timesteps, that runs more steps
    than asked, or indexes past the schedule (IndexError: 3 steps of 1000 reach 999 + 1)."""
    timesteps = int(cfg.training.model.get("timesteps", 1000))
    sc = cfg.samples
    if sampler_for(cfg, cfg.samples) in ("PLMS", "DDIM") and timesteps % sc.steps:
        divisors = [n for n in (10, 20, 25, 40, 50, 100, 125, 200, 250) if timesteps % n == 0]
        raise ConfigError(
            "samples.steps",
            f"{sc.steps} does not divide the model's {timesteps} timesteps, which {sc.sampler} needs; "
            f"allowed: a divisor such as {', '.join(map(str, divisors))}",
        )


def _check_sdxl(cfg: Any) -> None:
    """What an SDXL model can be sampled from: a .nemo (NeMo cannot convert an SDXL .ckpt), trained with
    its text encoders."""
    given = cfg.samples.checkpoint
    if given and not str(given).endswith(".nemo"):
        raise ConfigError(
            "samples.checkpoint",
            f"{given}: an SDXL training checkpoint cannot be sampled (NeMo's convert_ckpt_to_nemo.py has no "
            "SDXL model type); allowed: null (the .nemo sd_xl_train.py saves at the end of training) or a .nemo",
        )


def check_checkpoint(cfg: Any) -> None:
    """samples.checkpoint as the trained family allows it, for a stage that reads it without the samples
    stage planned (SDXL's evaluation generates from it)."""
    if is_sdxl(cfg.training.model):
        _check_sdxl(cfg)


def check_sdxl_text_encoders(cfg: Any, model: dict[str, Any], source: str) -> None:
    """A model trained from cached text embeddings: its .nemo holds no text encoders and its conditioner
    reads stored embeddings, not prompts, so sd_xl_infer.py cannot sample it (docs/latents.md). The
    evaluation's SDXL generation refuses it too."""
    planned_training = source == PLANNED_MODEL
    if latents.enabled(cfg) if planned_training else model.get("precache_mode") == PRECACHE_MODE:
        key = latents.SWITCH if planned_training else "samples.checkpoint"
        raise ConfigError(
            key,
            f"{'true' if planned_training else source}: an SDXL model trained from cached text embeddings has "
            "no text encoders in its .nemo and its conditioner reads stored embeddings, not prompts; allowed: "
            f"samples of an SDXL model trained from the image tars ({latents.SWITCH}=false)",
        )


def _check(cfg: Any, planned: frozenset[str]) -> None:
    """Steps the sampler can take, a checkpoint the container sees, and prompts NeMo would save over
    each other (it names images by their first 50 characters)."""
    _check_steps(cfg)
    if is_sdxl(cfg.training.model):
        _check_sdxl(cfg)
    if cfg.samples.checkpoint and cfg.container.runtime is Runtime.pyxis:
        require_mounted("samples.checkpoint", cfg.samples.checkpoint, cfg.container.mounts)
    seen: dict[str, int] = {}
    for i, prompt in enumerate(cfg.samples.prompts):
        head = prompt[:NAME_CHARS]
        if head in seen:
            raise ConfigError(
                f"samples.prompts[{i}]",
                f"starts with the same {NAME_CHARS} characters as samples.prompts[{seen[head]}]: NeMo names "
                "each image after them and would write one over the other; allowed: prompts that differ "
                f"within their first {NAME_CHARS} characters",
            )
        seen[head] = i


def _given_checkpoint(cfg: Any) -> Path:
    """samples.checkpoint, refused unless it is a NeMo training checkpoint."""
    path = Path(cfg.samples.checkpoint)
    if not path.is_file() or path.suffix != ".ckpt":
        raise ConfigError(
            "samples.checkpoint",
            f"{path} is not an existing .ckpt file; allowed: a training checkpoint "
            "(…/results/checkpoints/*.ckpt), or null for this run's newest",
        )
    if checkpoints.step_of(path) is None:
        raise ConfigError(
            "samples.checkpoint",
            f"{path.name} has no '-step=<N>' in its name as NeMo writes it; allowed: a checkpoint under "
            "NeMo's own name",
        )
    return path


def _final_nemo(cfg: Any, stage: str) -> Path:
    """samples.checkpoint (a .nemo), or the .nemo SDXL training saved at its end."""
    if cfg.samples.checkpoint:
        path = Path(cfg.samples.checkpoint)
        if not path.is_file():
            raise ConfigError(
                "samples.checkpoint", f"{path} does not exist; allowed: an existing .nemo, or null"
            )
        return path
    found = checkpoints.final_nemo(checkpoints_dir(cfg))
    if found is None:
        raise ConfigError(
            "samples.checkpoint",
            f"is null (the .nemo SDXL training saves at its end) but {checkpoints_dir(cfg)} has none; allowed: "
            f"a .nemo path, or stages=[training,{stage}]",
        )
    return found


def _newest_checkpoint(cfg: Any) -> Path:
    found = checkpoints.newest(checkpoints_dir(cfg), _ema(cfg))
    if found is None:
        raise ConfigError(
            "samples.checkpoint",
            f"is null (this run's newest finished checkpoint) but {checkpoints_dir(cfg)} has no finished "
            f"{'-EMA ' if _ema(cfg) else ''}checkpoint; allowed: a checkpoint path, or stages=[training,samples]",
        )
    return found


def trained_model(cfg: Any, planned: frozenset[str], stage: str = NAME) -> tuple[dict[str, Any], str]:
    """The model config the sampled checkpoint was trained with, and where it was read: the checkpoint's
    hparams.yaml (NeMo's conversion needs it too), or the training planned in this launch. `stage`: the
    stage asking (SDXL's evaluation evaluates what this stage samples), named in the refusals."""
    from omegaconf import OmegaConf

    if not cfg.samples.checkpoint and "training" in planned:
        return dict(cfg.training.model), PLANNED_MODEL
    if is_sdxl(cfg.training.model):
        nemo = _final_nemo(cfg, stage)
        try:
            text = checkpoints.nemo_model_config(nemo)
        except ValueError as error:
            raise ConfigError("samples.checkpoint", f"{error}; allowed: a .nemo NeMo saved") from error
        return OmegaConf.to_container(OmegaConf.create(text)), f"{nemo} (model_config.yaml)"  # type: ignore[return-value]
    path = _given_checkpoint(cfg) if cfg.samples.checkpoint else _newest_checkpoint(cfg)
    hparams = checkpoints.hparams_of(path)
    if not hparams.is_file():
        raise ConfigError(
            "samples.checkpoint",
            f"{hparams} does not exist: NeMo's conversion of {path.name} needs the training's hparams.yaml "
            "two folders up from the checkpoint",
        )
    model = OmegaConf.to_container(OmegaConf.load(hparams).get("cfg") or {})
    return model, str(hparams)  # type: ignore[return-value]


def _host_check(cfg: Any, planned: frozenset[str], facts: Facts) -> None:
    """The checkpoint must exist now (or come from training planned with it), and the resolution be the
    one it was trained at."""
    model, source = trained_model(cfg, planned)
    if is_sdxl(cfg.training.model):
        check_sdxl_text_encoders(cfg, model, source)
    trained, wanted = trained_size(model), cfg.samples.resolution
    if wanted is None and trained is None:
        raise ConfigError("samples.resolution", f"is null but {source} fixes no image size; allowed: a size")
    if wanted is not None and trained is not None and trained != (wanted, wanted):
        size = f"{trained[0]}x{trained[1]}"
        allowed = f"null or {trained[0]}" if trained[0] == trained[1] else "null"
        raise ConfigError(
            "samples.resolution",
            f"{wanted}: the model was trained at {size} ({source}); allowed: {allowed}",
        )


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
