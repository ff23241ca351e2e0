"""training.init_from: the UNet starts from an earlier run's weights (NVIDIA's curriculum: 512 px from 256 px).

NeMo loads `model.unet_config.from_pretrained` with `from_NeMo: true` (its own key names). Optimizer, step
counter and schedule start fresh: this run has its own results folder, so exp_manager's resume_if_exists
finds nothing of the earlier run. A whole NeMo checkpoint also holds the VAE, CLIP and noise-schedule
buffers (NeMo counts them as unexpected keys), so one small CPU job, `<name>_init` (launcher/jobs/init_unet.py),
writes the UNet-only state dict to <run>/training/init/unet.ckpt, the fixed path training reads. That job
picks the earlier run's newest finished checkpoint (its -EMA twin when that run kept EMA weights) when it
starts; while the earlier run's training is queued or running it waits (afterok) on that run's last
training part, so it takes the final checkpoint.

Refused before submission, naming training.init_from: a preset that continues another (training.continues,
set by the curriculum's 512 px presets) without init_from (`none` says "random weights on purpose"), a
missing run or file, a run with no finished checkpoint and no live training, and a UNet that does not
match this preset. NeMo discards tensors of another shape without a word, so the shapes are compared here,
first from the earlier run's model config (its hparams.yaml, or its training config while it still
trains), then in the checkpoint the init job would take now: its zip index and pickle are read for the
`model.model.diffusion_model.*` names and shapes (launcher.checkpoint_index), no tensor loaded, so a
truncated or foreign file fails here and not in the queue hours later.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher import checkpoints, manifest, nemo_python
from launcher.context import Context, Facts
from launcher.errors import ConfigError
from launcher.init_from import FROM_SCRATCH, UNET_PREFIX
from launcher.nemo_python import NemoJob
from launcher.outputs import TrainingOutputs
from launcher.paths import run_dir_of
from launcher.spec import ExternalDependency, JobSpec
from launcher.stages.common import cpu_resources, make_job
from launcher.unet_shape import differences, tensor_problems, unet_shape

KEY = "training.init_from"
CONF = Path(__file__).resolve().parents[2] / "conf"


@dataclass(frozen=True)
class Source:
    """What training.init_from names, as found before submission."""

    # The checkpoint the init job would take now; None while the earlier run still trains.
    checkpoint: Path | None
    # The Slurm id of the earlier run's last training part while it is queued or running.
    live_job: str | None
    # The earlier model config (NeMo's `model` section) and the file it was read from.
    model: dict[str, Any]
    model_file: Path


def check_checkpoint(checkpoint: Path, model: Mapping[str, Any]) -> None:
    """The file the init job would take is a torch checkpoint whose UNet has the shapes of `model`'s
    (NeMo's model section); refused naming training.init_from. No tensor is loaded."""
    from launcher import checkpoint_index

    try:
        state = checkpoint_index.tensor_shapes(checkpoint)
    except checkpoint_index.NotACheckpoint as error:
        raise ConfigError(KEY, f"{checkpoint} is {error}; allowed: a NeMo training .ckpt") from None
    # The tensors the init job keeps; a UNet trained with model.inductor (torch.compile, on in the presets)
    # is saved under `<prefix>_orig_mod.`, which NeMo's from_pretrained drops (openaimodel.py).
    unet = {
        name.removeprefix(UNET_PREFIX).removeprefix("_orig_mod."): dims
        for name, dims in state.items()
        if name.startswith(UNET_PREFIX)
    }
    if not unet:
        raise ConfigError(
            KEY,
            f"{checkpoint} holds no {UNET_PREFIX}* tensor ({len(state)} tensors in its state_dict): not a NeMo "
            "Stable Diffusion checkpoint; allowed: a NeMo training .ckpt",
        )
    problems = tensor_problems(unet, unet_shape(model))
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise ConfigError(
            KEY,
            f"{checkpoint}'s UNet tensors do not match training.model.unet_config: {'; '.join(problems[:3])}{more}. "
            "NeMo would train those from random weights; allowed: a checkpoint of the same UNet",
        )


def _load_model(path: Path, section: str) -> dict[str, Any]:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(path).get(section) or {}, resolve=True)  # type: ignore[return-value]


def _live_training(run: Path) -> str | None:
    """The id of the run's last training part when any training part is queued or running."""
    from launcher.job_states import status

    if not (run / manifest.MANIFEST).exists():
        return None
    training = [st for st in status(run) if st.record.stage == "training"]
    if not any(st.active for st in training):
        return None
    return training[-1].record.job_id


def _from_checkpoint(path: Path) -> Source:
    if not path.is_file():
        raise ConfigError(
            KEY, f"{path} does not exist; allowed: a NeMo training .ckpt, or an earlier run folder"
        )
    hparams = checkpoints.hparams_of(path)
    if not hparams.is_file():
        raise ConfigError(
            KEY,
            f"{hparams} does not exist: the model config of {path.name} (NeMo's hparams.yaml two folders up) "
            "is what its UNet is checked against; allowed: a checkpoint in NeMo's results layout, or its run folder",
        )
    return Source(path, None, _load_model(hparams, "cfg"), hparams)


def _from_run(run: Path) -> Source:
    earlier = TrainingOutputs(run)
    live = _live_training(run)
    found = None if live else earlier.newest_weights()
    if live is None and found is None:
        raise ConfigError(
            KEY,
            f"{run} has no finished checkpoint in {earlier.checkpoints} and no training queued or running; "
            "allowed: a run folder whose training wrote a checkpoint (or still runs), or a .ckpt file",
        )
    if found is not None and checkpoints.hparams_of(found).is_file():
        return Source(
            found, live, _load_model(checkpoints.hparams_of(found), "cfg"), checkpoints.hparams_of(found)
        )
    configs = earlier.configs()
    if not configs:
        raise ConfigError(KEY, f"{run} has no training config in {earlier.stage_dir}: not a training run")
    return Source(found, live, _load_model(configs[0], "model"), configs[0])


def given(cfg: Any) -> str | None:
    """training.init_from as a path, or None: unset (null) or random weights on purpose (none)."""
    value = cfg.training.init_from
    return None if value in (None, FROM_SCRATCH) else value


def source(cfg: Any) -> Source | None:
    """training.init_from as found now, or None when unset; refused with the key named."""
    named = given(cfg)
    if named is None:
        return None
    path = Path(named)
    if path.suffix == ".ckpt":
        return _from_checkpoint(path)
    if not path.is_dir():
        raise ConfigError(
            KEY,
            f"{path} is neither a .ckpt file nor a folder; allowed: an earlier run folder or a .ckpt file",
        )
    if path.resolve() == run_dir_of(cfg).resolve():
        raise ConfigError(
            KEY, f"{path} is this run's own folder (which resumes by itself); allowed: an earlier run"
        )
    return _from_run(path)


def _continued_run_name(preset: str) -> str | None:
    """The run name the preset `preset` trains under by default (its training.run.name), from conf/."""
    import yaml

    presets = CONF / "training"
    file = presets / f"{preset}.yaml"
    if not file.is_file():
        known = sorted(str(p.relative_to(presets).with_suffix("")) for p in presets.rglob("*.yaml"))
        raise ConfigError(
            "training.continues", f"{preset!r} is not a training preset; allowed: {', '.join(known)}"
        )
    run = (yaml.safe_load(file.read_text()) or {}).get("run") or {}
    return run.get("name")


def _check_continuation(cfg: Any) -> None:
    """A preset that continues another (training.continues) says which weights its UNet starts from."""
    tr = cfg.training
    unet = tr.model.get("unet_config") or {}
    if tr.continues is None or tr.init_from is not None or unet.get("from_pretrained"):
        return
    name = _continued_run_name(tr.continues)
    folder = f"{cfg.base_results_dir}/{name}" if name else "<its run folder>"
    raise ConfigError(
        KEY,
        f"not set, but {tr.run.name} continues {tr.continues} (training.continues): its UNet starts from that "
        f"training's weights. Allowed: that run's folder (by default {folder}) or one of its .ckpt files, or "
        f"{KEY}={FROM_SCRATCH} to start from random weights on purpose",
    )


def check(cfg: Any) -> None:
    """The config alone: a continuation names its start; init_from and an explicit
    unet_config.from_pretrained would contradict."""
    _check_continuation(cfg)
    unet = cfg.training.model.get("unet_config") or {}
    if given(cfg) and unet.get("from_pretrained"):
        raise ConfigError(
            KEY,
            f"is set and so is training.model.unet_config.from_pretrained ({unet.get('from_pretrained')}); "
            "allowed: one of them (init_from sets from_pretrained to the UNet it extracts)",
        )


def host_check(cfg: Any) -> None:
    """The earlier weights exist (or will, from a live run) and their UNet has this preset's shapes."""
    found = source(cfg)
    if found is None:
        return
    theirs, ours = unet_shape(found.model), unet_shape(cfg.training.model)
    differ = differences(theirs, ours)
    if differ:
        raise ConfigError(
            KEY,
            f"its UNet does not match training.model.unet_config ({found.model_file}): {'; '.join(differ)}. "
            "NeMo would drop every tensor of another shape and train those from random weights; allowed: a "
            "run or checkpoint of the same UNet",
        )
    if found.checkpoint is not None:
        check_checkpoint(found.checkpoint, cfg.training.model)


def probe(cfg: Any, facts: Facts) -> str | None:
    """The id of the live earlier training's last part, which the init job waits for (the stage's
    StageSpec.probe: its planner reads it as `facts.probed[stage]`)."""
    found = source(cfg) if given(cfg) else None
    return found.live_job if found else None


def _live_job(ctx: Context, stage: str) -> str | None:
    return ctx.facts.probed.get(stage)


def nemo_job(cfg: Any) -> NemoJob:
    """The init job reads the checkpoint with torch, so it runs NeMo's interpreter (training.run.python)."""
    return NemoJob(f"{cfg.training.run.name}_init")


def nemo_jobs(cfg: Any) -> tuple[NemoJob, ...]:
    return (nemo_job(cfg),) if given(cfg) else ()


def plan(ctx: Context, stage: str) -> JobSpec | None:
    """The init job (None without init_from): training's first part waits for it."""
    tr = ctx.cfg.training
    start = given(ctx.cfg)
    if start is None:
        return None
    out = TrainingOutputs(ctx.run_dir).init_unet
    job = make_job(
        ctx,
        stage=stage,
        name=f"{tr.run.name}_init",
        argv=(
            nemo_python.interpreter(ctx.cfg, ctx.facts, nemo_job(ctx.cfg)),
            "-m",
            "launcher.jobs.init_unet",
            start,
            str(out),
        ),
        resources=cpu_resources(ctx, tr.init_resources),
    )
    wait = _live_job(ctx, stage)
    if not wait:
        return job
    return dataclasses.replace(
        job, after_external=(ExternalDependency(wait, f"{KEY}: its last training part"),)
    )


def notes(ctx: Context, stage: str) -> tuple[str, ...]:
    tr = ctx.cfg.training
    start = given(ctx.cfg)
    if start is None:
        return (
            (f"training: the UNet starts from random weights ({KEY}={FROM_SCRATCH})",) if tr.continues else ()
        )
    wait = _live_job(ctx, stage)
    if Path(start).suffix == ".ckpt":
        which = "that checkpoint"
    elif wait:
        which = f"its final checkpoint, once its training job {wait} has ended (afterok)"
    else:
        which = "its newest finished checkpoint when the init job starts"
    return (
        f"training: UNet from {start}: {which}, EMA weights when kept; optimizer, step and schedule "
        f"start fresh. The {tr.run.name}_init job writes its UNet to {TrainingOutputs(ctx.run_dir).init_unet}",
    )
