"""evaluation: FID and CLIP score on COCO-2014 val over a range of guidance scales, with a plot.

Three jobs: `eval_captions` (CPU) samples `num_images` captions with a seed; `eval_generate`, a GPU array
with one task per guidance scale, runs NeMo's own generate_fid_images.py (one process per GPU) on the
model the samples job converted last; `eval_score` (one GPU) computes FID against the val2014 images and
CLIP score, and writes evaluation/results.{csv,md} and fid_clip.png. Chosen with samples it waits for
them; alone it evaluates the newest model.nemo under <run>/samples/.

What differs by model family is the family's (launcher.families, `inference`): its samplers and
generation script (evaluation.sampler and evaluation.generate_script null: the family's own), and where
the model comes from. A family whose checkpoints NeMo does not convert (SDXL: NeMo has no FID script for
it either, so each generation task runs NeMo's sd_xl_infer.py on its share of the captions,
launcher/jobs/generate.py) is evaluated from the .nemo the samples stage samples (samples.checkpoint,
else the one training saves at its end), refused as the samples stage refuses it (a .ckpt); chosen with
training it waits for training, not for the samples job. Unless that .nemo was trained from cached text
embeddings: the samples job writes a copy with its text encoders back (the family's cache.restore),
and, as for a converted checkpoint, the evaluation waits for it and generates from the newest one
(settings.from_samples, launcher.stages.sampled.evaluated_from_samples): one copy per run, not per task.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher import nemo_config
from launcher.checkpoints import hparams_of, nemo_model_config
from launcher.config import JobResources, Runtime
from launcher.context import Context, Facts
from launcher.errors import ConfigError
from launcher.evaluation.settings import CAPTIONS_JSON, EvaluationSettings
from launcher.families import all_samplers
from launcher.outputs import EvaluationOutputs, SamplesOutputs
from launcher.paths import relative_to_run, run_dir_of
from launcher.rules import FOLDER, SLURM_MEM, Choice, Each, Range, SlurmTime, Text, ruled
from launcher.sampling.resolution import trained_size
from launcher.spec import Array, JobSpec
from launcher.stage import AssetNeeds, StageSpec
from launcher.stages import sampled
from launcher.stages.common import after, cpu_resources, gpu_task_resources, make_job, require_mounted

NAME = "evaluation"
# The CLIP score loads the text encoder's repo as a whole CLIP model (openai's repo holds the image tower
# too), with its image preprocessing; FID needs the Inception network's weights.
ASSETS = AssetNeeds(repo_files=(("text_encoder", ("preprocessor_config.json",)),), files=("inception",))
CAPTIONS_JOB, GENERATE_JOB, SCORE_JOB = "eval_captions", "eval_generate", "eval_score"
# torchmetrics' FrechetInceptionDistance(feature=...): the Inception layers it can read (valid_int_input).
FID_FEATURES = (64, 192, 768, 2048)


@dataclass
class EvaluationConfig:
    """FID and CLIP score on COCO-2014 val (conf/evaluation/default.yaml)."""

    coco_root: str | None = ruled(
        FOLDER, None, help="COCO-2014 with val2014/ and annotations/captions_val2014.json (you supply it)."
    )
    num_images: int = ruled(Range(2), 30000, help="Captions sampled, one image generated per scale each.")
    seed: int = ruled(
        Range(0, 2**31 - 1), 2014, help="Caption sample and starting noise: same seed, same captions."
    )
    guidance_scales: list[float] = ruled(
        Each(Range(1, 30, integer=False), min_items=1),
        factory=lambda: [1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0],
        help="One array task per scale.",
    )
    sampler: str | None = ruled(
        Choice(all_samplers()),
        None,
        help="NeMo's sampler, one of the trained model family's; null = the family's first (SD: PLMS, "
        "SDXL: EulerEDMSampler).",
    )
    steps: int = ruled(Range(1, 1000), 50, help="Sampling steps (PLMS/DDIM: a divisor of 1000).")
    fid_features: int = ruled(
        Choice(FID_FEATURES),
        2048,
        help="FID's Inception layer (torchmetrics' choices): 2048 is the FID papers report; the smaller "
        "layers suit runs with fewer images than features. Scores of different layers do not compare.",
    )
    batch_size: int = ruled(
        Range(1, 256),
        16,
        help="Images generated at once per GPU (x GPUs: a multiple of micro_batch_size); SD only: "
        "sd_xl_infer.py draws one caption at a time.",
    )
    precision: str = ruled(
        Choice(("16-mixed", "bf16-mixed", "32-true")), "16-mixed", help="Generation precision."
    )
    python: str = ruled(Text(), "python3", help="NeMo's interpreter in the container.")
    generate_script: str | None = ruled(
        Text(),
        None,
        help="What generates the images; null = the trained model family's (SD: NeMo's FID image generation "
        "/opt/NeMo/examples/multimodal/text_to_image/stable_diffusion/generate_fid_images.py, SDXL: "
        "sd_xl_infer.py there).",
    )
    score_python: str = ruled(
        Text(), "/opt/eval/bin/python", help="An interpreter with torch, torchmetrics and torch-fidelity."
    )
    generate_time: str = ruled(SlurmTime(), "04:00:00", help="Time limit of each generation task.")
    score_time: str = ruled(SlurmTime(), "02:00:00", help="Time limit of the score job.")
    score_mem: str | None = ruled(SLURM_MEM, "64G", help="Memory of the one-GPU score job.")
    captions_resources: JobResources = field(
        default_factory=lambda: JobResources(cpus_per_task=1, mem="4G", time="00:20:00")
    )


def settings(ctx: Context) -> EvaluationSettings:
    ev, assets, family = ctx.cfg.evaluation, ctx.cfg.assets, sampled.family(ctx.cfg)
    converts = family.inference.converts_checkpoints
    planned = frozenset(stage.name for stage in ctx.stages)
    return EvaluationSettings(
        run_dir=str(ctx.run_dir),
        coco_root=str(ev.coco_root),
        num_images=ev.num_images,
        guidance_scales=tuple(float(g) for g in ev.guidance_scales),
        seed=ev.seed,
        family=family.name,
        from_samples=sampled.evaluated_from_samples(ctx.cfg, planned),
        checkpoint=None if converts else ctx.cfg.samples.checkpoint,
        checkpoints_dir=str(sampled.checkpoints_dir(ctx.cfg)),
        sampler=sampled.sampler(ctx.cfg, NAME),
        steps=ev.steps,
        batch_size=ev.batch_size,
        precision=ev.precision,
        tasks_per_node=max(ctx.cfg.cluster.gpus_per_node, 1),
        nemo_python=ev.python,
        generate_script=ev.generate_script or family.inference.generate_script,
        score_python=ev.score_python,
        plot_python=ctx.python,
        code_dir=ctx.code_dir,
        inception_weights=assets.inception.path,
        fid_features=ev.fid_features,
        clip_dir=assets.text_encoder.local_dir,
    )


def settings_path(run: Path) -> Path:
    return EvaluationOutputs(run).settings


def plan(ctx: Context) -> tuple[JobSpec, ...]:
    ev, s = ctx.cfg.evaluation, settings(ctx)
    config = str(settings_path(ctx.run_dir))
    captions = make_job(
        ctx,
        stage=NAME,
        name=CAPTIONS_JOB,
        resources=cpu_resources(ctx, ev.captions_resources),
        argv=ctx.module(
            "launcher.jobs.captions",
            "--coco-root",
            ev.coco_root,
            "--num",
            ev.num_images,
            "--seed",
            ev.seed,
            "--out",
            EvaluationOutputs(ctx.run_dir).stage_dir,
        ),
    )
    generate = make_job(
        ctx,
        stage=NAME,
        name=GENERATE_JOB,
        argv=(ev.python, "-u", "-m", "launcher.jobs.generate", config),
        resources=gpu_task_resources(ctx, s.tasks_per_node, ev.generate_time, ctx.cfg.cluster.gpu_job_mem),
        array=Array(len(ev.guidance_scales)),
        depends_on=after(CAPTIONS_JOB),
        env=nemo_config.OFFLINE_HUB_ENV,
        with_code=False,
    )
    score = make_job(
        ctx,
        stage=NAME,
        name=SCORE_JOB,
        argv=(ev.score_python, "-u", "-m", "launcher.jobs.score", config),
        resources=gpu_task_resources(ctx, 1, ev.score_time, ev.score_mem),
        depends_on=after(GENERATE_JOB),
        env=nemo_config.OFFLINE_HUB_ENV,
        with_code=False,
    )
    return captions, generate, score


def _files(ctx: Context) -> tuple[tuple[Path, str], ...]:
    return ((settings_path(ctx.run_dir), settings(ctx).to_json()),)


def _notes(ctx: Context) -> tuple[str, ...]:
    ev, out, family, s = (
        ctx.cfg.evaluation,
        EvaluationOutputs(ctx.run_dir),
        sampled.family(ctx.cfg),
        settings(ctx),
    )
    script = Path(s.generate_script).name
    nemo = ctx.cfg.samples.checkpoint or "the .nemo saved at the end of training"
    if family.inference.converts_checkpoints:
        evaluated = "the model the samples job converted last"
    elif s.from_samples:
        copy = SamplesOutputs(ctx.run_dir).model("<N>")
        evaluated = f"{family.title} {nemo} with its text encoders back (the samples job's newest {copy}) with {script}"
    else:
        evaluated = f"{family.title} {nemo} with {script}"
    return (
        f"evaluation: {ev.num_images} COCO captions (seed {ev.seed}) x {len(ev.guidance_scales)} guidance "
        f"scale(s) {list(ev.guidance_scales)} of {evaluated}; results: {out.results_md}, {out.plot.name}",
    )


def _check(cfg: Any, planned: frozenset[str]) -> None:
    ev = cfg.evaluation
    sampled.check_nemo_given(cfg)  # generated from samples.checkpoint, with or without samples planned
    if not ev.coco_root:
        raise ConfigError(
            "evaluation.coco_root",
            "is null: the evaluation needs COCO-2014 (val2014/ and annotations/captions_val2014.json); allowed: "
            "the absolute folder holding them",
        )
    if len(set(ev.guidance_scales)) != len(ev.guidance_scales):
        raise ConfigError("evaluation.guidance_scales", f"{list(ev.guidance_scales)} repeats a value")
    sampled.check_sampler(cfg, NAME)
    if sampled.strided(cfg, NAME) and 1000 % ev.steps:
        sampler = sampled.sampler(cfg, NAME)
        raise ConfigError("evaluation.steps", f"{ev.steps} does not divide 1000, which {sampler} needs")
    if cfg.container.runtime is Runtime.pyxis:
        require_mounted("evaluation.coco_root", ev.coco_root, cfg.container.mounts)
        for name in ASSETS.files:  # staged by the assets job, read by the score job
            require_mounted(f"assets.{name}.path", getattr(cfg.assets, name).path, cfg.container.mounts)
        if (
            not sampled.family(cfg).inference.converts_checkpoints and cfg.samples.checkpoint
        ):  # the .nemo read
            require_mounted("samples.checkpoint", cfg.samples.checkpoint, cfg.container.mounts)


def _host_check(cfg: Any, planned: frozenset[str], facts: Facts) -> None:
    """COCO as the jobs will read it, and a model to evaluate (the samples job converts it, or puts the
    text encoders back in it)."""
    root = Path(cfg.evaluation.coco_root)
    for needed in ("val2014", CAPTIONS_JSON):
        if not (root / needed).exists():
            raise ConfigError(
                "evaluation.coco_root",
                f"{root} has no {needed}; allowed: a COCO-2014 folder with val2014/ and {CAPTIONS_JSON}",
            )
    family = sampled.family(cfg)
    if sampled.evaluated_from_samples(cfg, planned):
        evaluated = _evaluated_model(cfg, planned)
    else:
        # What the samples stage would sample, refused as it refuses it.
        evaluated, source = sampled.trained_model(cfg, planned, NAME)
        if trained_size(evaluated) is None:
            raise ConfigError(
                "samples.checkpoint",
                f"{source} fixes no image size (data.train.augmentations); allowed: an {family.title} model "
                "trained at one size",
            )
    # Only a global batch is divided by the model's micro batch (sd_xl_infer.py draws each caption alone).
    if family.inference.batch_is_global:
        _check_batch(cfg, evaluated)


def _evaluated_model(cfg: Any, planned: frozenset[str]) -> dict[str, Any]:
    """The model config of what will be evaluated: the samples stage's, or that of the newest model the
    samples job made sampleable (converted: its hparams.yaml; a copy with its text encoders back: its own)."""
    from omegaconf import OmegaConf

    if "samples" in planned:
        return sampled.trained_model(cfg, planned)[0]
    converted = SamplesOutputs(run_dir_of(cfg))
    found = converted.newest_converted()
    made = "converted" if sampled.family(cfg).inference.converts_checkpoints else "wrote"
    if found is None:
        raise ConfigError(
            "stages",
            f"evaluation alone needs a model the samples job {made} ({converted.model('<N>')}) and there "
            "is none; allowed: stages=[samples,evaluation] (or with training)",
        )
    if not sampled.family(cfg).inference.converts_checkpoints:
        try:
            return OmegaConf.to_container(OmegaConf.create(nemo_model_config(found[0])))  # type: ignore[return-value]
        except ValueError as error:
            raise ConfigError(
                "stages", f"{error}; allowed: stages=[samples,evaluation], which writes it again"
            ) from error
    hparams = hparams_of(found[1])
    return OmegaConf.to_container(OmegaConf.load(hparams).get("cfg") or {}) if hparams.is_file() else {}  # type: ignore[return-value]


def _check_batch(cfg: Any, model: dict[str, Any]) -> None:
    """generate_fid_images.py makes batch_size x tasks the model's global batch, and NeMo's microbatch
    calculator (megatron_init.py) asserts that it divides by the model's micro_batch_size."""
    batch, tasks = cfg.evaluation.batch_size, max(cfg.cluster.gpus_per_node, 1)
    micro = int(model.get("micro_batch_size", 1))
    if (batch * tasks) % micro:
        step = micro // math.gcd(micro, tasks)
        raise ConfigError(
            "evaluation.batch_size",
            f"{batch} x {tasks} task(s) per node = {batch * tasks} is not a multiple of the model's "
            f"micro_batch_size {micro}: NeMo refuses that global batch when it loads the model; allowed: a "
            f"multiple of {step}",
        )


def status_lines(run: Path) -> list[str]:
    out = EvaluationOutputs(run)
    shown = (relative_to_run(path, run) for path in (out.results_md, out.plot))
    return ["evaluation: FID and CLIP score in {}, plot {}".format(*shown)] if out.results_md.exists() else []


STAGE = StageSpec(
    name=NAME,
    config=EvaluationConfig,
    plan=plan,
    # A model the samples job makes sampleable (converts, or puts the text encoders back in) is evaluated
    # from there; another from the .nemo training saves, which the samples job does not touch.
    needs=lambda cfg: (
        ("assets", "samples")
        if sampled.evaluated_from_samples(cfg, frozenset(cfg.stages))
        else ("assets", "training")
    ),
    check=_check,
    host_check=_host_check,
    assets=lambda cfg: ASSETS,
    files=_files,
    notes=_notes,
    status=status_lines,
)
