"""evaluation: FID and CLIP score on COCO-2014 val over a range of guidance scales, with a plot.

Three jobs: `eval_captions` (CPU) samples `num_images` captions with a seed; `eval_generate`, a GPU array
with one task per guidance scale, runs NeMo's own generate_fid_images.py (one process per GPU) on the
model the samples job converted last; `eval_score` (one GPU) computes FID against the val2014 images and
CLIP score, and writes evaluation/results.{csv,md} and fid_clip.png. Chosen with samples it waits for
them; alone it evaluates the newest model.nemo under <run>/samples/.

SDXL (data_prep.model_family): NeMo has no FID script for SDXL, so each generation task runs NeMo's
sd_xl_infer.py on its share of the captions (launcher/evaluation/generate.py) from the .nemo the samples
stage samples (samples.checkpoint, else the one training saves at its end: there is nothing to convert),
refused as the samples stage refuses it (a .ckpt, a model trained from cached text embeddings). Chosen
with training it waits for training, not for the samples job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data_prep.model_family import is_sdxl
from launcher import nemo_config
from launcher.checkpoints import hparams_of
from launcher.config import JobResources, Runtime
from launcher.context import Context, Facts
from launcher.errors import ConfigError
from launcher.evaluation.settings import CAPTIONS_JSON, EvaluationSettings
from launcher.outputs import EvaluationOutputs, SamplesOutputs
from launcher.paths import relative_to_run, run_dir_of
from launcher.rules import ABS_PATH, SLURM_MEM, Choice, Each, Range, SlurmTime, Text, ruled
from launcher.sampling.resolution import trained_size
from launcher.spec import Array, JobSpec, Resources
from launcher.stage import AssetNeeds, StageSpec
from launcher.stages import samples
from launcher.stages.common import after, cpu_resources, make_job, require_mounted

NAME = "evaluation"
# The CLIP score loads the text encoder's repo as a whole CLIP model (openai's repo holds the image tower
# too), with its image preprocessing; FID needs the Inception network's weights.
ASSETS = AssetNeeds(repo_files=(("text_encoder", ("preprocessor_config.json",)),), files=("inception",))
CAPTIONS_JOB, GENERATE_JOB, SCORE_JOB = "eval_captions", "eval_generate", "eval_score"


@dataclass
class EvaluationConfig:
    """FID and CLIP score on COCO-2014 val (conf/evaluation/default.yaml)."""

    coco_root: str | None = ruled(
        ABS_PATH, None, help="COCO-2014 with val2014/ and annotations/captions_val2014.json (you supply it)."
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
    sampler: str = ruled(Choice(("PLMS", "DDIM", "DPM")), "PLMS", help="NeMo's SD sampler.")
    sdxl_sampler: str = ruled(
        Choice(samples.SDXL_SAMPLERS),
        "EulerEDMSampler",
        help="NeMo's SDXL sampler (sd_xl_infer's sampling.base.sampler), for SDXL presets.",
    )
    steps: int = ruled(Range(1, 1000), 50, help="Sampling steps (PLMS/DDIM: a divisor of 1000).")
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
    generate_script: str = ruled(
        Text(),
        "/opt/NeMo/examples/multimodal/text_to_image/stable_diffusion/generate_fid_images.py",
        help="NeMo's FID image generation.",
    )
    sdxl_generate_script: str = ruled(
        Text(),
        "/opt/NeMo/examples/multimodal/text_to_image/stable_diffusion/sd_xl_infer.py",
        help="NeMo's SDXL text-to-image inference, which generates the images for SDXL presets.",
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
    ev, assets, sdxl = ctx.cfg.evaluation, ctx.cfg.assets, is_sdxl(ctx.cfg.training.model)
    return EvaluationSettings(
        run_dir=str(ctx.run_dir),
        coco_root=str(ev.coco_root),
        num_images=ev.num_images,
        guidance_scales=tuple(float(g) for g in ev.guidance_scales),
        seed=ev.seed,
        sdxl=sdxl,
        checkpoint=ctx.cfg.samples.checkpoint if sdxl else None,
        checkpoints_dir=str(samples.checkpoints_dir(ctx.cfg)),
        sampler=samples.sampler_for(ctx.cfg, ctx.cfg.evaluation),
        steps=ev.steps,
        batch_size=ev.batch_size,
        precision=ev.precision,
        tasks_per_node=max(ctx.cfg.cluster.gpus_per_node, 1),
        nemo_python=ev.python,
        generate_script=ev.sdxl_generate_script if sdxl else ev.generate_script,
        score_python=ev.score_python,
        plot_python=ctx.python,
        code_dir=ctx.code_dir,
        inception_weights=assets.inception.path,
        clip_dir=assets.text_encoder.local_dir,
    )


def settings_path(run: Path) -> Path:
    return EvaluationOutputs(run).settings


def _gpu_resources(ctx: Context, tasks: int, time: str, mem: str | None) -> Resources:
    cl = ctx.cfg.cluster
    gpus = tasks if cl.gpus_per_node >= 1 else None  # a cluster without GPUs (local) runs on CPU
    cpus = max(cl.cpus_per_node // max(cl.gpus_per_node, 1), 1) if cl.cpus_per_node else 1
    return Resources(
        nodes=1,
        ntasks_per_node=tasks,
        cpus_per_task=cpus,
        gpus_per_node=gpus,
        mem=mem,
        time=time,
        partition=cl.partition,
    )


def plan(ctx: Context) -> tuple[JobSpec, ...]:
    ev, s = ctx.cfg.evaluation, settings(ctx)
    config = str(settings_path(ctx.run_dir))
    captions = make_job(
        ctx,
        stage=NAME,
        name=CAPTIONS_JOB,
        resources=cpu_resources(ctx, ev.captions_resources),
        argv=ctx.module(
            "launcher.evaluation.captions",
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
        argv=(ev.python, "-u", f"{ctx.code_dir}/launcher/evaluation/generate.py", config),
        resources=_gpu_resources(ctx, s.tasks_per_node, ev.generate_time, ctx.cfg.cluster.gpu_job_mem),
        array=Array(len(ev.guidance_scales)),
        depends_on=after(CAPTIONS_JOB),
        env=nemo_config.OFFLINE_HUB_ENV,
        with_code=False,
    )
    score = make_job(
        ctx,
        stage=NAME,
        name=SCORE_JOB,
        argv=(ev.score_python, "-u", f"{ctx.code_dir}/launcher/evaluation/score.py", config),
        resources=_gpu_resources(ctx, 1, ev.score_time, ev.score_mem),
        depends_on=after(GENERATE_JOB),
        env=nemo_config.OFFLINE_HUB_ENV,
        with_code=False,
    )
    return captions, generate, score


def _files(ctx: Context) -> tuple[tuple[Path, str], ...]:
    return ((settings_path(ctx.run_dir), settings(ctx).to_json()),)


def _notes(ctx: Context) -> tuple[str, ...]:
    ev, out = ctx.cfg.evaluation, EvaluationOutputs(ctx.run_dir)
    model = (
        f"SDXL {ctx.cfg.samples.checkpoint or 'the .nemo saved at the end of training'} with sd_xl_infer.py"
        if is_sdxl(ctx.cfg.training.model)
        else "the model the samples job converted last"
    )
    return (
        f"evaluation: {ev.num_images} COCO captions (seed {ev.seed}) x {len(ev.guidance_scales)} guidance "
        f"scale(s) {list(ev.guidance_scales)} of {model}; results: {out.results_md}, {out.plot.name}",
    )


def _check(cfg: Any, planned: frozenset[str]) -> None:
    ev = cfg.evaluation
    samples.check_checkpoint(cfg)  # SDXL generates from samples.checkpoint, with or without samples planned
    if not ev.coco_root:
        raise ConfigError(
            "evaluation.coco_root",
            "is null: the evaluation needs COCO-2014 (val2014/ and annotations/captions_val2014.json); allowed: "
            "the absolute folder holding them",
        )
    if len(set(ev.guidance_scales)) != len(ev.guidance_scales):
        raise ConfigError("evaluation.guidance_scales", f"{list(ev.guidance_scales)} repeats a value")
    if samples.sampler_for(cfg, cfg.evaluation) in ("PLMS", "DDIM") and 1000 % ev.steps:
        raise ConfigError("evaluation.steps", f"{ev.steps} does not divide 1000, which {ev.sampler} needs")
    if cfg.container.runtime is Runtime.pyxis:
        require_mounted("evaluation.coco_root", ev.coco_root, cfg.container.mounts)
        for name in ASSETS.files:  # staged by the assets job, read by the score job
            require_mounted(f"assets.{name}.path", getattr(cfg.assets, name).path, cfg.container.mounts)
        if is_sdxl(cfg.training.model) and cfg.samples.checkpoint:  # the .nemo the generation reads
            require_mounted("samples.checkpoint", cfg.samples.checkpoint, cfg.container.mounts)


def _host_check(cfg: Any, planned: frozenset[str], facts: Facts) -> None:
    """COCO as the jobs will read it, and a model to evaluate (the samples job converts it)."""
    root = Path(cfg.evaluation.coco_root)
    for needed in ("val2014", CAPTIONS_JSON):
        if not (root / needed).exists():
            raise ConfigError(
                "evaluation.coco_root",
                f"{root} has no {needed}; allowed: a COCO-2014 folder with val2014/ and {CAPTIONS_JSON}",
            )
    if is_sdxl(cfg.training.model):
        # What the samples stage would sample, refused as it refuses it. sd_xl_infer.py draws each caption
        # alone (num_samples 1 per prompt): no batch rule.
        model, source = samples.trained_model(cfg, planned, NAME)
        samples.check_sdxl_text_encoders(cfg, model, source)
        if trained_size(model) is None:
            raise ConfigError(
                "samples.checkpoint",
                f"{source} fixes no image size (data.train.augmentations.resize_smallest_side); allowed: an "
                "SDXL model trained at one size",
            )
        return
    _check_batch(cfg, _evaluated_model(cfg, planned))


def _evaluated_model(cfg: Any, planned: frozenset[str]) -> dict[str, Any]:
    """The model config of what will be evaluated: the samples stage's, or the newest converted one's."""
    from omegaconf import OmegaConf

    if "samples" in planned:
        return samples.trained_model(cfg, planned)[0]
    converted = SamplesOutputs(run_dir_of(cfg))
    found = converted.newest_converted()
    if found is None:
        raise ConfigError(
            "stages",
            f"evaluation alone needs a model the samples job converted ({converted.model('<N>')}) and there "
            "is none; allowed: stages=[samples,evaluation] (or with training)",
        )
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
    # SDXL evaluates the .nemo training saves, which the samples job does not touch.
    needs=lambda cfg: ("assets", "training") if is_sdxl(cfg.training.model) else ("assets", "samples"),
    check=_check,
    host_check=_host_check,
    assets=lambda cfg: ASSETS,
    files=_files,
    notes=_notes,
    status=status_lines,
)
