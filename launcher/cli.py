"""The launcher: compose conf/ with Hydra, validate, plan, then submit, run locally, or dry-run.

    python launcher/main.py stages=[data_preparation,training] cluster=aws_p5 dry_run=true
    sd-launch stages=[data_preparation,training] cluster=aws_p5 dry_run=true      (the same, installed)

Arguments are Hydra overrides (key=value, group=option, +new.key=value). `--cfg` prints the
composed config and exits; `--help` lists the config groups.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path, PurePosixPath
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf

from launcher import backends, manifest, nemo_config, precache, preflight, relaunch, summary
from launcher.config import Resubmit
from launcher.errors import LauncherError
from launcher.layout import DataLayout
from launcher.limits import fit
from launcher.pipeline import build_plan
from launcher.stages.common import Facts
from launcher.validate import check_facts, to_schema

REPO = Path(__file__).resolve().parent.parent


def _preflight(cfg: Any) -> None:
    world = nemo_config.world_size(cfg)
    layout = DataLayout(PurePosixPath(cfg.data_dir))
    wdinfo = layout.latent_wdinfo if precache.enabled(cfg) else layout.wdinfo
    found = preflight.check(cfg, Path(wdinfo), world)
    for note in found.notes:
        print(f"preflight: {note}")
    for warning in found.warnings:
        print(f"preflight warning: {warning}", file=sys.stderr)
    if found.problems and not cfg.dry_run:
        raise LauncherError("preflight failed:\n  " + "\n  ".join(found.problems))
    for problem in found.problems:
        print(f"preflight warning (dry run): {problem}", file=sys.stderr)


def host_facts() -> Facts:
    """This machine's facts, probed once here so that planning never probes."""
    nemo = REPO / ".venv-nemo" / "bin" / "python"
    return Facts(
        python=sys.executable,
        code_dir=str(REPO),
        cpu_count=os.cpu_count() or 1,
        nemo_python=str(nemo) if nemo.exists() else None,
    )


def launch(composed: DictConfig, facts: Facts | None = None) -> Path:
    """Everything after composition; returns the run folder."""
    cfg = to_schema(composed)
    facts = facts or host_facts()
    check_facts(cfg, facts)
    _preflight(cfg)
    plan = build_plan(cfg, facts)
    backend_name = cfg.cluster.backend.value
    if backend_name == "slurm":  # arrays above MaxArraySize go in parts; too many jobs are refused here
        from launcher.backends.slurm import limits_for

        limits = limits_for(cfg.cluster.max_array_size, cfg.cluster.max_job_count, ask=not cfg.dry_run)
        plan = fit(plan, limits)
    # One launch of a run folder at a time, and never while its jobs are live (launcher.relaunch); the
    # local backend runs its jobs inside this lock.
    with relaunch.run_lock(plan.run_dir):
        request = relaunch.request_for(plan, cfg.resubmit is Resubmit.missing, backend_name)
        _submit(cfg, composed, request, backend_name)
    return plan.run_dir


def _submit(cfg: Any, composed: DictConfig, request: backends.Request, backend_name: str) -> None:
    run_dir = request.plan.run_dir
    if not request.scripts and request.kept:
        print(f"nothing to submit: every job of {run_dir} completed or is still queued or running")
        return
    manifest.write_atomic(run_dir / "config.yaml", OmegaConf.to_yaml(composed, resolve=True))
    if cfg.dry_run:
        backends.write_files(request)
        if not request.kept:  # a dry run of resubmit=missing leaves the earlier launch's manifest alone
            manifest.save(run_dir, backends.records(request, {}, "dry_run"))
        summary.dry_run(request)
        return
    options = {"parallelism": cfg.cluster.local_parallelism} if backend_name == "local" else {}
    summary.starting(request, backend_name)
    job_ids = backends.get(backend_name, **options).schedule(request)
    summary.submitted(request, job_ids, backend_name, cfg.data_dir)


CONF = REPO / "conf"
# `${cwd:}` in conf/: the folder the launcher was started from.
OmegaConf.register_new_resolver("cwd", os.getcwd, replace=True)


def compose_config(overrides: list[str]) -> DictConfig:
    """The conf/ tree composed once (hydra.main would compose it twice per start)."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def _help() -> str:
    groups = sorted(p.name for p in CONF.iterdir() if p.is_dir())
    lines = [__doc__ or "", "config groups (group=option):"]
    for group in groups:
        options = sorted(
            str(p.relative_to(CONF / group).with_suffix("")) for p in (CONF / group).rglob("*.yaml")
        )
        lines.append(f"  {group}: {', '.join(options)}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if "--help" in argv or "-h" in argv:
        print(_help())
        return 0
    overrides = [arg for arg in argv if arg != "--cfg"]
    try:
        composed = compose_config(overrides)
        if "--cfg" in argv:
            print(OmegaConf.to_yaml(composed))
            return 0
        launch(composed)
    except (HydraException, LauncherError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def run() -> None:
    """The `sd-launch` console command."""
    sys.exit(main(sys.argv[1:]))
