"""What the samples and evaluation stages draw from, decided at planning time: the trained model's family
(launcher.families) and the sampler it is asked for, the checkpoint or .nemo sampled, and the model
config it was trained with.

A family whose checkpoints NeMo converts (`inference.converts_checkpoints`) is sampled from a training
.ckpt (this run's newest finished one, or samples.checkpoint) and its hparams.yaml; another from a .nemo
(samples.checkpoint, else the one training saves at its end) and the model config stored in it. A
model trained from cached text embeddings (`from_cached_text`) is sampled from a copy of its .nemo with the
staged text encoders put back (the family's cache.restore: the samples job writes it), and the
evaluation then generates from that copy, as from a converted checkpoint (`evaluated_from_samples`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from launcher import checkpoints, latents
from launcher.errors import ConfigError
from launcher.families import family_of
from launcher.families.family import Family, job_function
from launcher.outputs import TrainingOutputs
from launcher.paths import run_dir_of

# Where the training planned in this launch fixes the size (trained_model's source).
PLANNED_MODEL = "training.model.data.train.augmentations"


def family(cfg: Any) -> Family:
    """The family of the trained model: that of the training config (a checkpoint's is the same)."""
    return family_of(cfg.training.model)


def sampler(cfg: Any, section: str) -> str:
    """`<section>.sampler` (samples, evaluation); null: the trained family's first sampler."""
    return getattr(cfg, section).sampler or family(cfg).inference.default_sampler


def check_sampler(cfg: Any, section: str) -> None:
    """The trained family can be drawn from, and `<section>.sampler` is one of its samplers."""
    given, fam = getattr(cfg, section).sampler, family(cfg)
    if section == "evaluation" and fam.inference.program.generate is None:
        raise ConfigError(
            "stages",
            f"names {section}, but {fam.title} declares no generator of its images "
            f"(inference.program.generate); allowed with a {fam.title} preset: stages without {section}",
        )
    if given is not None and given not in fam.inference.samplers:
        raise ConfigError(
            f"{section}.sampler",
            f"{given!r} is not a sampler of {fam.title}; allowed: {', '.join(fam.inference.samplers)}, or "
            f"null ({fam.inference.default_sampler})",
        )


def program_inputs(cfg: Any) -> dict[str, Any]:
    """What the trained family's inference program reads besides the sampling settings
    (Inference.program_inputs), refused naming the key when bad."""
    reference = family(cfg).inference.program_inputs
    return job_function(reference)(cfg) if reference else {}


def prompts(cfg: Any) -> dict[str, str]:
    """What the samples draw, by the key that gives each: the trained family's own prompts
    (Inference.prompts), then those of samples.prompts not among them."""
    reference = family(cfg).inference.prompts
    own = dict(reference(cfg)) if reference else {}
    given = {f"samples.prompts[{i}]": p for i, p in enumerate(cfg.samples.prompts) if p not in own.values()}
    return {**own, **given}


def strided(cfg: Any, section: str) -> bool:
    """Whether the section's sampler takes every (timesteps // steps)-th timestep (steps must divide)."""
    return sampler(cfg, section) in family(cfg).inference.strided_samplers


def ema(cfg: Any) -> bool:
    """Whether training keeps NeMo's EMA weights (training.exp_manager.ema.enable)."""
    return bool((cfg.training.exp_manager.get("ema") or {}).get("enable"))


def checkpoints_dir(cfg: Any) -> Path:
    return TrainingOutputs(run_dir_of(cfg)).checkpoints


def given_checkpoint(cfg: Any, section: str = "samples") -> Path:
    """`<section>.checkpoint` (samples, export), refused unless it is a NeMo training checkpoint."""
    key = f"{section}.checkpoint"
    path = Path(getattr(cfg, section).checkpoint)
    if not path.is_file() or path.suffix != ".ckpt":
        raise ConfigError(
            key,
            f"{path} is not an existing .ckpt file; allowed: a training checkpoint "
            "(…/results/checkpoints/*.ckpt), or null for this run's newest",
        )
    if checkpoints.step_of(path) is None:
        raise ConfigError(
            key,
            f"{path.name} has no '-step=<N>' in its name as NeMo writes it; allowed: a checkpoint under "
            "NeMo's own name",
        )
    return path


def nemo_to_sample(cfg: Any, stage: str) -> Path:
    """samples.checkpoint (a .nemo), or the .nemo training saved at its end."""
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
            f"is null (the .nemo {family(cfg).title} training saves at its end) but {checkpoints_dir(cfg)} has "
            f"none; allowed: a .nemo path, or stages=[training,{stage}]",
        )
    return found


def newest_checkpoint(cfg: Any, section: str = "samples", with_ema: bool | None = None) -> Path:
    """This run's newest finished checkpoint (the EMA kind when `with_ema`, null: when training keeps EMA
    weights), refused naming `<section>.checkpoint` when there is none."""
    wanted = ema(cfg) if with_ema is None else with_ema
    found = checkpoints.newest(checkpoints_dir(cfg), wanted)
    if found is None:
        raise ConfigError(
            f"{section}.checkpoint",
            f"is null (this run's newest finished checkpoint) but {checkpoints_dir(cfg)} has no finished "
            f"{'-EMA ' if wanted else ''}checkpoint; allowed: a checkpoint path, or stages=[training,{section}]",
        )
    return found


def trained_model(cfg: Any, planned: frozenset[str], stage: str = "samples") -> tuple[dict[str, Any], str]:
    """The model config the sampled checkpoint was trained with, and where it was read: the checkpoint's
    hparams.yaml (NeMo's conversion needs it too), a .nemo's model_config.yaml, or the training planned in
    this launch. `stage`: the stage asking (an evaluation of a .nemo evaluates what the samples stage
    samples), named in the refusals."""
    from omegaconf import OmegaConf

    if not cfg.samples.checkpoint and "training" in planned:
        return dict(cfg.training.model), PLANNED_MODEL
    if not family(cfg).inference.converts_checkpoints:
        nemo = nemo_to_sample(cfg, stage)
        try:
            text = checkpoints.nemo_model_config(nemo)
        except ValueError as error:
            raise ConfigError("samples.checkpoint", f"{error}; allowed: a .nemo NeMo saved") from error
        return OmegaConf.to_container(OmegaConf.create(text)), f"{nemo} (model_config.yaml)"  # type: ignore[return-value]
    path = given_checkpoint(cfg) if cfg.samples.checkpoint else newest_checkpoint(cfg)
    return hparams_model(path, "samples.checkpoint", "NeMo's conversion of"), str(
        checkpoints.hparams_of(path)
    )


def hparams_model(checkpoint: Path, key: str, reader: str) -> dict[str, Any]:
    """The model config a training checkpoint was trained with (its hparams.yaml two folders up), refused
    naming `key` when there is none (`reader`: who reads it, "NeMo's conversion of")."""
    from omegaconf import OmegaConf

    hparams = checkpoints.hparams_of(checkpoint)
    if not hparams.is_file():
        raise ConfigError(
            key,
            f"{hparams} does not exist: {reader} {checkpoint.name} needs the training's hparams.yaml two "
            "folders up from the checkpoint",
        )
    return OmegaConf.to_container(OmegaConf.load(hparams).get("cfg") or {})  # type: ignore[return-value]


def from_cached_text(cfg: Any, planned: frozenset[str]) -> bool:
    """Whether the sampled model was trained from cached inputs that leave its .nemo unsampleable (a family
    with a `cache.restore`, SDXL's cached text embeddings): with training planned in this launch
    (samples.checkpoint null), the switch; else what the restore reads in the .nemo's stored config
    (samples.checkpoint, or the one training saved at its end). The samples job then samples a copy the
    family's cache.restore writes (SDXL's: its text encoders back). False while there is no .nemo to read
    yet (the host checks refuse that)."""
    restore = family(cfg).cache.restore
    if restore is None:
        return False
    if not cfg.samples.checkpoint and "training" in planned:
        return latents.enabled(cfg)
    nemo = (
        Path(cfg.samples.checkpoint)
        if cfg.samples.checkpoint
        else checkpoints.final_nemo(checkpoints_dir(cfg))
    )
    if nemo is None or nemo.suffix != ".nemo" or not nemo.is_file():
        return False
    try:
        stored = yaml.safe_load(checkpoints.nemo_model_config(nemo))
    except (ValueError, yaml.YAMLError):
        return False  # refused by trained_model, naming samples.checkpoint
    return isinstance(stored, dict) and bool(job_function(restore).needed(stored))


def evaluated_from_samples(cfg: Any, planned: frozenset[str]) -> bool:
    """Whether the evaluation generates from the model the samples job made sampleable (its newest
    samples/step_<N>/model.nemo) rather than from the .nemo the samples stage samples: a checkpoint NeMo
    converts, a model trained from cached text embeddings (its copy with the text encoders back), or a LoRA
    run (its adapters merged into the whole model: launcher/sampling/lora_merge.py)."""
    lora = bool(cfg.training.model.get("peft"))
    return family(cfg).inference.converts_checkpoints or from_cached_text(cfg, planned) or lora


def check_restorable(
    cfg: Any, model: dict[str, Any], source: str, unswitched: dict[str, Any], unswitched_source: str
) -> None:
    """A .nemo trained from cached text embeddings is sampled once the caption embedders of the training
    config before the switch (`unswitched`, the encode step's) are back in it: they must switch to the
    .nemo's own (the family's cache.restore.check, pure). Training planned in this launch is switched from
    that very config."""
    reference = family(cfg).cache.restore
    if source == PLANNED_MODEL or reference is None:
        return
    try:
        job_function(reference).check(model, unswitched)
    except ValueError as error:
        raise ConfigError(
            "samples.checkpoint",
            f"{source}: trained from cached text embeddings, its text encoders are put back from "
            f"{unswitched_source} (the training config before the switch) and {error}; allowed: a .nemo "
            "trained with this launch's training config, or from the image tars",
        ) from error


def check_nemo_given(cfg: Any) -> None:
    """A family whose checkpoints NeMo cannot convert is sampled from a .nemo only: samples.checkpoint as
    the samples stage and the evaluation (which generates from it, samples planned or not) read it."""
    given, trained = cfg.samples.checkpoint, family(cfg)
    if trained.inference.converts_checkpoints:
        return
    title = trained.title
    if given and not str(given).endswith(".nemo"):
        raise ConfigError(
            "samples.checkpoint",
            f"{given}: an {title} training checkpoint cannot be sampled (the samples job converts no "
            f"{title} checkpoint to a .nemo); allowed: null (the .nemo training saves at its end) or a .nemo",
        )
