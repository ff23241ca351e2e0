"""One step of the rehearsal (launcher.jobs.rehearsal runs each in its own process, as a chained job would).

    python -m launcher.jobs.rehearsal_step --step 1|2 --config TINY.yaml --sd-train TRAIN.py --record OUT.json
        [--planned PLANNED.yaml --init-from SOURCE] [--sample OUT.png]

NeMo's own training script (training.run.script: sd_train.py, sd_xl_train.py) runs as it runs in the
training job (its Hydra entry, MegatronTrainerBuilder, exp_manager, the family's NeMo model, Lightning's
fit, checkpointing), on CPU (launcher.jobs.nemo_cpu), on the tiny config; step 1 stops after one step, step 2
must resume from step 1's checkpoint and reach 2. Around it, without changing what NeMo does, this step
records the model NeMo builds (the family's `rehearsal.model_class`, launcher/families), the trainer's
resume point and the latents the UNet is fed (their size must be the one the config trains at).
Step 1 first checks training.init_from's UNet against the planned full-size UNet; step 2 then samples
one image from the trained model with NeMo's own sampling code (launcher.jobs.rehearsal_sample). What it
found goes to --record (JSON); a failure also keeps NeMo's traceback in the log, and its one line in the
record.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import runpy
import sys
import time
from pathlib import Path
from typing import Any

from data_prep.atomic import write_atomic
from data_prep.latent_format import downsampling
from launcher.families import family_of
from launcher.families.family import Family, Rehearsal, job_function
from launcher.jobs.rehearsal_shapes import suspect


class RehearsalFinding(Exception):
    """What the rehearsal found wrong in the plan (its message names the config key)."""


def one_line(exc: BaseException, limit: int = 600) -> str:
    """An exception as one line: its type and its text (Hydra's wrapped errors span several lines).

    >>> one_line(OSError("Can't load tokenizer for '/m'.\\nMake sure it is a folder"))
    "OSError: Can't load tokenizer for '/m'. Make sure it is a folder"
    """
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    found = text if isinstance(exc, RehearsalFinding) else f"{type(exc).__name__}: {text}"
    return found if len(found) <= limit else found[: limit - 3] + "..."


def nemo_error(exc: BaseException, config: Any) -> str:
    """NeMo's error as one line; a module NeMo could not build (Hydra's "Error in call to target") is
    named by its key in the training config (nested ones too: SDXL's conditioner embedders), with the
    first sentence of the constructor's own error.

    >>> from omegaconf import OmegaConf
    >>> cfg = OmegaConf.create({"model": {"cond_stage_config": {"_target_": "nemo.x.FrozenCLIPEmbedder"}}})
    >>> try:
    ...     raise ValueError("Error in call to target 'nemo.x.FrozenCLIPEmbedder':") from OSError("No vocab. Try X.")
    ... except ValueError as exc:
    ...     print(nemo_error(exc, cfg))
    training.model.cond_stage_config (FrozenCLIPEmbedder): NeMo cannot build it: OSError: No vocab.
    """
    from omegaconf import DictConfig, OmegaConf

    target = re.match(r"Error in call to target '([\w.]+)'", str(exc))
    model = (config if isinstance(config, DictConfig) else OmegaConf.load(config)).model
    unet = OmegaConf.to_container(model.get("unet_config") or OmegaConf.create())
    if (key := suspect(str(exc), unet)) is not None:  # type: ignore[arg-type]
        return f"{key} ({one_line(exc)})"
    keys = _targets(OmegaConf.to_container(model))
    if target is None or exc.__cause__ is None or target[1] not in keys:
        return one_line(exc)
    inner = one_line(exc.__cause__)
    first = inner.split(". ", 1)[0]
    first += "" if first.endswith(".") or first == inner else "."
    return f"training.model.{keys[target[1]]} ({target[1].rsplit('.', 1)[-1]}): NeMo cannot build it: {first}"


def _targets(section: Any, key: str = "") -> dict[str, str]:
    """{_target_: its dotted key under `model`} of every section, outermost first (the first key kept).

    >>> _targets({"a": {"_target_": "X", "b": [{"c": {"_target_": "Y"}}]}})
    {'X': 'a', 'Y': 'a.b.0.c'}
    """
    found: dict[str, str] = {}
    if isinstance(section, dict) and key and "_target_" in section:
        found[str(section["_target_"])] = key
    children = section.items() if isinstance(section, dict) else enumerate(section or ())
    for name, child in children if isinstance(section, dict | list) else ():
        if isinstance(child, dict | list):
            for target, where in _targets(child, f"{key}.{name}" if key else str(name)).items():
                found.setdefault(target, where)
    return found


def _unet(module: Any, rehearsal: Rehearsal) -> Any:
    for name in rehearsal.unet.split("."):
        module = getattr(module, name)
    return module


class Probe:
    """Records what NeMo builds and feeds, without changing it: the model and trainer (wrapping the
    family's NeMo model's __init__; exp_manager has set the resume point by then) and the first
    latents the UNet receives (a forward pre-hook)."""

    def __init__(self) -> None:
        self.model: Any = None
        self.resumed_from: str | None = None
        self.unet_input: list[int] | None = None

    def install(self, rehearsal: Rehearsal) -> None:
        nemo_class = job_function(rehearsal.model_class)
        nemo_init = nemo_class.__init__
        probe = self

        # Lightning's save_hyperparameters reads __init__'s signature: wraps keeps NeMo's.
        @functools.wraps(nemo_init)
        def init(self: Any, cfg: Any, trainer: Any) -> None:
            nemo_init(self, cfg, trainer)
            probe.model = self
            probe.resumed_from = getattr(trainer, "ckpt_path", None)
            _unet(self, rehearsal).register_forward_pre_hook(probe._record_input, with_kwargs=True)

        nemo_class.__init__ = init

    def _record_input(self, module: Any, args: Any, kwargs: Any) -> None:
        x = args[0] if args else kwargs.get("x")
        if self.unet_input is None and x is not None:
            self.unet_input = list(x.shape)


def run_sd_train(script: Path, config: Path, overrides: list[str]) -> None:
    """NeMo's training script as its own __main__, with Hydra's command line; its errors propagate."""
    if not script.is_file():
        raise RehearsalFinding(
            f"training.run.script (or rehearsal.script): {script} does not exist where the job runs "
            "(inside the container when there is one); allowed: NeMo's training script there "
            "(sd_train.py, sd_xl_train.py)"
        )
    os.environ["HYDRA_FULL_ERROR"] = "1"  # the original exception, not Hydra's summary and sys.exit
    sys.argv = [str(script), "--config-path", str(config.parent), "--config-name", config.name, *overrides]
    runpy.run_path(str(script), run_name="__main__")


def check_init_unet(planned: Path, source: str) -> dict[str, Any]:
    """training.init_from's UNet tensors against the planned full-size UNet, built on the meta device
    (no memory, no compute), with NeMo's own loading (its key renaming, from_NeMo)."""
    import torch
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    # The init job's own resolution of a run folder (newest finished checkpoint, EMA twin when kept).
    from launcher.init_from import UNET_PREFIX, checkpoint_of

    key = "training.init_from"
    try:
        checkpoint = checkpoint_of(Path(source))
    except SystemExit as exc:  # a run that still trains has no finished checkpoint yet
        return {"source": source, "checked": False, "note": str(exc)}
    try:
        state = torch.load(checkpoint, map_location="cpu", mmap=True, weights_only=False)["state_dict"]
    except Exception as exc:
        raise RehearsalFinding(
            f"{key}: {checkpoint} is no torch checkpoint NeMo can read: {one_line(exc)}"
        ) from None
    unet_state = {name: value for name, value in state.items() if name.startswith(UNET_PREFIX)}
    if not unet_state:
        raise RehearsalFinding(
            f"{key}: {checkpoint} holds no {UNET_PREFIX}* tensors: not a NeMo SD checkpoint"
        )
    section = OmegaConf.load(planned).model.unet_config
    section.from_pretrained = None
    section.use_flash_attention = False
    with torch.device("meta"):
        unet = instantiate(section)
    missing, unexpected, mismatched, errors = unet._load_pretrained_model(
        unet_state, ignore_mismatched_sizes=True, from_NeMo=True
    )
    found = {"missing": missing, "unexpected": unexpected, "mismatched": mismatched, "errors": errors}
    problems = [f"{len(v)} {name} (e.g. {sorted(map(str, v))[0]})" for name, v in found.items() if v]
    if problems:
        raise RehearsalFinding(
            f"{key}: {checkpoint}'s UNet does not fit training.model.unet_config: {'; '.join(problems)}"
        )
    return {"source": source, "checkpoint": str(checkpoint), "checked": True, "tensors": len(unet_state)}


def check_latents(probe: Probe, config: Any) -> None:
    """The UNet must be fed latents of the size the config trains at (the family's `trained_size`: SD's
    crop, SDXL's resize_smallest_side square). NeMo trains on any size: a latents folder of another
    resolution would train the wrong model without a word."""
    model = config.model
    crop = family_of(model).trained_size(model)
    if probe.unet_input is None or crop is None or model.data.get("synthetic_data"):
        return
    wanted = [crop[0] // downsampling(model), crop[1] // downsampling(model)]
    if probe.unet_input[-2:] != wanted:
        got = "x".join(map(str, probe.unet_input[1:]))
        raise RehearsalFinding(
            f"training.model.data: the UNet is fed {got} latents from {model.data.webdataset.local_root_path}, "
            f"but the config trains at {crop[0]}x{crop[1]} px, which gives {wanted[0]}x{wanted[1]}: that data "
            "was prepared at another resolution; allowed: this preset's data folder (training.data.folder) or data "
            "prepared with this config"
        )


def sample(probe: Probe, family: Family, rehearsal: Rehearsal, config: Any, out: Path) -> None:
    """One image from the trained model with the family's sampler, its CPU patches applied first."""
    from launcher.jobs.rehearsal_sample import draw

    for patch in rehearsal.sampler_patches:
        for line in job_function(patch)():
            print(f"rehearsal: patched {line}", flush=True)
    size = family.trained_size(config.model) or (256, 256)
    draw(rehearsal.sampler, probe.model, config, size, out)


def run(args: argparse.Namespace, record: dict[str, Any]) -> None:
    from omegaconf import OmegaConf

    from launcher.jobs.nemo_cpu import patch_for_cpu

    for line in patch_for_cpu():
        print(f"rehearsal: patched {line}", flush=True)
    if args.init_from:
        record["init_from"] = check_init_unet(args.planned, args.init_from)
        print(f"rehearsal: training.init_from: {json.dumps(record['init_from'])}", flush=True)
    config = OmegaConf.load(args.config)
    family = family_of(config.model)
    rehearsal = family.rehearsal
    if rehearsal is None:  # the planner refuses it first (launcher/stages/rehearsal.py)
        raise RehearsalFinding(
            f"rehearsal.enable: {family.rehearsal_refusal or 'no rehearsal for ' + family.title}"
        )
    probe = Probe()
    probe.install(rehearsal)
    overrides = [f"trainer.max_steps={args.step}"]
    os.chdir(args.config.parent)  # where Hydra and Lightning may write their own files
    run_sd_train(args.sd_train, args.config, overrides)
    if probe.model is None:
        built = rehearsal.model_class.rsplit(":", 1)[-1]
        raise RehearsalFinding(f"{args.sd_train} returned without building NeMo's {built}")
    trainer = probe.model.trainer
    record.update(
        steps=int(trainer.global_step),
        resumed_from=probe.resumed_from,
        unet_input=probe.unet_input,
        unet_parameters=sum(p.numel() for p in _unet(probe.model, rehearsal).parameters()),
    )
    check_latents(probe, config)
    if record["steps"] != args.step:
        raise RehearsalFinding(
            f"NeMo stopped at step {record['steps']}, not {args.step} (training.exp_manager.max_time_per_run?)"
        )
    if args.step > 1 and not probe.resumed_from:
        raise RehearsalFinding(
            "NeMo started step 2 from scratch instead of resuming step 1's checkpoint: a chained or "
            "requeued training job would too (training.exp_manager.resume_if_exists must stay true)"
        )
    if args.sample:
        sample(probe, family, rehearsal, config, args.sample)
        record["sample"] = str(args.sample)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m launcher.jobs.rehearsal_step", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--step", type=int, required=True, choices=(1, 2))
    parser.add_argument("--config", type=Path, required=True, help="the rehearsal's tiny training config")
    parser.add_argument("--sd-train", type=Path, required=True, help="NeMo's training script")
    parser.add_argument("--record", type=Path, required=True, help="what this step found (JSON)")
    parser.add_argument("--planned", type=Path, help="the planned training config (for --init-from)")
    parser.add_argument("--init-from", help="training.init_from: its UNet is checked against --planned")
    parser.add_argument("--sample", type=Path, help="draw one image from the trained model here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    record: dict[str, Any] = {"step": args.step}
    started = time.monotonic()
    code = 0
    try:
        run(args, record)
    except RehearsalFinding as exc:  # found in the plan: the line says it all
        record["error"] = one_line(exc)
        code = 1
    except BaseException as exc:  # NeMo's own error: its traceback stays in the log
        record["error"] = nemo_error(exc, args.config)
        raise
    finally:
        record["seconds"] = round(time.monotonic() - started, 1)
        write_atomic(args.record, json.dumps(record, indent=2))
    return code


if __name__ == "__main__":
    sys.exit(main())
