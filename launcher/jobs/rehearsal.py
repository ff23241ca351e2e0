"""The rehearsal: the planned training, run as it will run but tiny and on CPU, before any GPU job.

    python -m launcher.jobs.rehearsal --training-config PLANNED.yaml --sd-train TRAIN.py --workdir DIR
        --report REPORT.json --sample SAMPLE.png [--init-from SOURCE] [--synthetic-data]

It runs in the training job's container, with its mounts and environment (the launcher plans it like
the training job, on a CPU node), on the config the training job reads, changed only where a CPU and a
tiny UNet need it (launcher.jobs.rehearsal_config). NeMo's own training script (training.run.script:
sd_train.py, or sd_xl_train.py for SDXL) trains step 1 from scratch on the prepared data (or cached
latents) with the staged VAE and text encoders and writes a checkpoint; a second process resumes it for
step 2 and samples one image (launcher.jobs.rehearsal_step, launcher.jobs.rehearsal_sample). What differs by
model family is the family's `rehearsal` (launcher/families/family.py). With training.init_from,
the earlier UNet is checked against the planned one first. The report (JSON) says what it found; a
failure ends the log in one line, `rehearsal: error: <what, naming the key>`, and the GPU jobs waiting
on it (afterok) are cancelled by Slurm.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from data_prep.atomic import write_atomic
from data_prep.family_settings import FamilySettingsError, read_settings
from data_prep.faults import step_main
from launcher.errors import ConfigError
from launcher.families import as_planned
from launcher.jobs.rehearsal_config import STEPS, derive, tiny_width
from launcher.sampling.world import free_port

CONFIG_NAME = "training.yaml"


class RehearsalFailed(Exception):
    """The rehearsal found the plan broken: the message is its one line."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m launcher.jobs.rehearsal", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--training-config", type=Path, required=True, help="the training job's NeMo config")
    parser.add_argument(
        "--sd-train", type=Path, required=True, help="NeMo's training script, where the job runs"
    )
    parser.add_argument("--workdir", type=Path, required=True, help="the tiny config, NeMo's results")
    parser.add_argument("--report", type=Path, required=True, help="what it found (JSON)")
    parser.add_argument("--sample", type=Path, required=True, help="the image sampled after step 2")
    parser.add_argument("--init-from", help="training.init_from: its UNet is checked against the planned one")
    parser.add_argument("--synthetic-data", action="store_true", help="NeMo's synthetic data (a sweep alone)")
    return parser.parse_args(argv)


def prepare(args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    """A fresh workdir holding the tiny config; returns it and the report's first fields."""
    from omegaconf import OmegaConf

    if not args.training_config.is_file():
        raise RehearsalFailed(
            f"{args.training_config}: no such file (the training config the launcher wrote)"
        )
    planned = OmegaConf.to_container(OmegaConf.load(args.training_config), resolve=True)
    try:  # the family the planner found, found here too (a plugin's, from the run folder's copy)
        family = as_planned(planned["model"], read_settings(args.training_config).family)  # type: ignore[index]
    except (ConfigError, FamilySettingsError) as error:
        raise RehearsalFailed(str(error)) from error
    shutil.rmtree(args.workdir, ignore_errors=True)  # a relaunch rehearses from scratch
    args.sample.unlink(missing_ok=True)
    args.report.unlink(missing_ok=True)
    config, changes = derive(planned, args.workdir / "results", args.synthetic_data)  # type: ignore[arg-type]
    path = args.workdir / CONFIG_NAME
    write_atomic(path, OmegaConf.to_yaml(OmegaConf.create(config)))
    unet = planned.get("model", {}).get("unet_config", {})  # type: ignore[union-attr]
    data = config["model"]["data"]
    report = {
        "training_config": str(args.training_config),
        "family": family.name,
        "config": str(path),
        "unet_channels": [tiny_width(unet), unet.get("model_channels")],
        "data": "synthetic" if data.get("synthetic_data") else data.get("train", {}).get("dataset_path"),
        "changes": changes,
    }
    for line in changes:
        print(f"rehearsal: {line}", flush=True)
    return path, report


def _world_of_one() -> dict[str, str]:
    """The job's environment, its rendezvous on this node at a free port: Lightning's SLURM environment
    takes MASTER_ADDR/MASTER_PORT when set, else the first node's name (not always a host name) and a
    port derived from the job id. Both steps are a world of one process."""
    return {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}


def run_step(args: argparse.Namespace, config: Path, step: int) -> dict[str, Any]:
    """One step in its own process (a fresh start, then a resume, as chained jobs are); its record."""
    record = args.workdir / f"step{step}.json"
    # From the job's working folder, the checkout, as the job itself was started.
    argv = [sys.executable, "-u", "-m", "launcher.jobs.rehearsal_step", "--step", str(step)]
    argv += ["--config", str(config), "--sd-train", str(args.sd_train), "--record", str(record)]
    if step == 1 and args.init_from:
        argv += ["--planned", str(args.training_config), "--init-from", args.init_from]
    if step == STEPS:
        argv += ["--sample", str(args.sample)]
    print(f"rehearsal: step {step} of {STEPS}: {' '.join(argv)}", flush=True)
    code = subprocess.run(argv, env=_world_of_one(), check=False).returncode
    found = json.loads(record.read_text()) if record.is_file() else {}
    if code != 0 or "error" in found:
        cause = (
            found.get("error") or f"exit code {code} and no error recorded (killed: out of memory or time?)"
        )
        what = "from scratch" if step == 1 else "resuming step 1's checkpoint"
        raise RehearsalFailed(f"NeMo's training, step {step} of {STEPS} ({what}): {cause}")
    return found


def rehearse(args: argparse.Namespace, report: dict[str, Any]) -> None:
    config, prepared = prepare(args)
    report.update(prepared)
    for step in range(1, STEPS + 1):
        report[f"step{step}"] = run_step(args, config, step)
    report["init_from"] = report["step1"].get("init_from")
    report["sample"] = report[f"step{STEPS}"].get("sample")


@step_main("rehearsal", errors=RehearsalFailed)
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report: dict[str, Any] = {"ok": False}
    started = time.monotonic()
    try:
        rehearse(args, report)
        report["ok"] = True
    except RehearsalFailed as exc:
        report["error"] = str(exc)
        raise
    finally:
        report["seconds"] = round(time.monotonic() - started)
        write_atomic(args.report, json.dumps(report, indent=2))
    print(f"rehearsal: passed in {report['seconds']} s ({args.report})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
