"""data_check: NeMo's own SD loader reads the prepared data on CPU before training starts."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from typing import Any

from launcher import nemo_config
from launcher.config import BackendName, JobResources, Runtime
from launcher.context import Context, Facts
from launcher.errors import ConfigError
from launcher.outputs import DataCheckOutputs
from launcher.quoting import q
from launcher.rules import Range, Text, described, ruled
from launcher.spec import JobSpec
from launcher.stage import StageSpec
from launcher.stages.common import cpu_resources, make_job

NAME = "data_check"
# What makes the NeMo interpreter that data_check needs without a container (README, requirements-nemo.txt).
MAKE_NEMO_VENV = "python3 -m venv .venv-nemo && .venv-nemo/bin/pip install -r requirements-nemo.txt"


@dataclass
class DataCheckConfig:
    enable: bool = described(
        True, help="Read the prepared data with NeMo's own loader on CPU before any GPU time."
    )
    python: str | None = ruled(
        Text(),
        None,
        help=(
            "Interpreter with NeMo; null = training.run.python in a container, else the NeMo venv"
            " (.venv-nemo) or this launcher's own."
        ),
    )
    batches: int = ruled(Range(1), 4, help="Batches NeMo's loader must yield.")
    model_check: bool = described(
        True, help="Also build NeMo's UNet, VAE (staged weights, every key) and text encoder on CPU."
    )
    num_workers: int = ruled(
        Range(1), 1, help="Loader workers (NeMo's loader uses persistent workers: 0 is refused there)."
    )
    micro_batch_size: int = ruled(Range(1), 4, help="Samples per batch read by the check.")
    resources: JobResources = field(default_factory=lambda: JobResources(cpus_per_task=4, mem="16G"))


def nemo_python(cfg: Any, facts: Facts, explicit: str | None) -> str | None:
    """The interpreter of a CPU job that runs NeMo (data_check, the rehearsal): `explicit` (the stage's
    own `python` key), else training's in a container, else this checkout's NeMo venv (None without one)."""
    if explicit:
        return explicit
    if cfg.container.runtime is Runtime.pyxis:
        return cfg.training.run.python or cfg.container.python or "python3"
    return facts.nemo_python


def plan(ctx: Context) -> tuple[JobSpec, ...]:
    dc = ctx.cfg.data_check
    python = nemo_python(ctx.cfg, ctx.facts, dc.python)
    assert python, "refused by the host check"
    argv = (
        python,
        "-m",
        "data_prep.data_check",
        "--training-config",
        str(nemo_config.config_path(ctx)),
        "--world-size",
        str(nemo_config.world_size(ctx.cfg)),
        "--batches",
        str(dc.batches),
        "--num-workers",
        str(dc.num_workers),
        "--micro-batch-size",
        str(dc.micro_batch_size),
        "--report",
        str(DataCheckOutputs(ctx.run_dir).report),
        *(("--model-check",) if dc.model_check else ()),
    )
    resources = cpu_resources(ctx, dc.resources)
    job = make_job(
        ctx, stage=NAME, name="data_check", argv=argv, resources=resources, env=nemo_config.OFFLINE_HUB_ENV
    )
    return (job,)


def _needs(cfg: Any) -> tuple[str, ...]:
    """The data it reads; the staged models only when it builds them (the model check)."""
    return ("data_preparation", "assets") if cfg.data_check.model_check else ("data_preparation",)


def _check(cfg: Any, planned: frozenset[str]) -> None:
    if NAME in planned:
        nemo_config.check(cfg)


def require_nemo_python(cfg: Any, facts: Facts, key: str, explicit: str | None) -> None:
    """Without a container the job runs on this machine's NeMo interpreter, which must exist."""
    local = cfg.cluster.backend is BackendName.local and cfg.container.runtime is Runtime.none
    if explicit and local and shutil.which(explicit) is None:
        raise ConfigError(
            key,
            f"{explicit!r} is no interpreter on this machine, where the local backend runs the job; allowed: "
            f"a Python with NeMo, e.g. .venv-nemo/bin/python made by `{MAKE_NEMO_VENV}`",
        )
    if nemo_python(cfg, facts, explicit) is None:
        # The job's own interpreter has no torch: the job would end in a traceback in its log.
        raise ConfigError(
            key,
            f"None and this checkout has no NeMo interpreter ({facts.code_dir}/.venv-nemo/bin/python) to run "
            f"the job without a container; allowed: create it with `cd {q(facts.code_dir)} && "
            f"{MAKE_NEMO_VENV}`, or set {key} to a Python with NeMo",
        )


def _host_check(cfg: Any, planned: frozenset[str], facts: Facts) -> None:
    if NAME in planned:
        require_nemo_python(cfg, facts, "data_check.python", cfg.data_check.python)


STAGE = StageSpec(
    name=NAME,
    config=DataCheckConfig,
    plan=plan,
    needs=_needs,
    auto=lambda cfg: cfg.data_check.enable,
    check=_check,
    host_check=_host_check,
    files=nemo_config.config_files,
)
