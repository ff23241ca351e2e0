"""The interpreter with NeMo that each NeMo job runs, found one way for all of them, and the one refusal.

The jobs that need NeMo (or its torch): training and the benchmark sweep, training.init_from's init job,
data_check and encode_latents. A stage declares them (StageSpec.nemo_jobs) and each one's interpreter is,
in this order:
1. its own key, where it has one (`data_check.python`, `data_preparation.precache.python`) and it is set;
2. `training.run.python`, the interpreter every NeMo job shares;
3. in a container (pyxis), the image's `python3`, NeMo's (container.python is the image's data-prep venv);
4. without one, this checkout's NeMo venv, `.venv-nemo/bin/python` (Facts.nemo_python): the local backend
   runs it on this machine, Slurm's nodes where they see this checkout (container.code_dir's rule).
Else `check` refuses the launch before anything is written, in one line naming `training.run.python`,
every planned job without an interpreter and how to get one. A bare `python3` on a node without a
container is never assumed to hold NeMo: it fails in the queue, after the jobs before it ran.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from launcher.config import BackendName, Runtime
from launcher.context import Facts
from launcher.errors import ConfigError, Fix
from launcher.quoting import q

SHARED_KEY = "training.run.python"
IMAGE_PYTHON = "python3"  # NeMo's interpreter in NVIDIA's image and in this project's (Dockerfile)
MAKE_NEMO_VENV = "python3 -m venv .venv-nemo && .venv-nemo/bin/pip install -r requirements-nemo.txt"


@dataclass(frozen=True)
class NemoJob:
    """A planned job that runs NeMo: its name as the plan shows it, its own interpreter key (None: it
    reads training.run.python alone), and the override that plans it away (None: the plan needs it) with
    what that changes."""

    name: str
    key: str | None = None
    off: str | None = None
    off_means: str = ""


def _value(cfg: Any, key: str) -> Any:
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def found(cfg: Any, facts: Facts, job: NemoJob) -> tuple[str | None, str | None]:
    """(the interpreter, the key that set it); (None, None) when there is none."""
    for key in (job.key, SHARED_KEY):
        value = _value(cfg, key) if key else None
        if value:
            return str(value), key
    if cfg.container.runtime is Runtime.pyxis:
        return IMAGE_PYTHON, None
    return facts.nemo_python, None


def interpreter(cfg: Any, facts: Facts, job: NemoJob) -> str:
    """For a planner: the job's interpreter (`check` refused a launch without one before planning; a plan
    made without that check, as some tests make them, gets the image's name)."""
    return found(cfg, facts, job)[0] or IMAGE_PYTHON


def check(cfg: Any, facts: Facts, jobs: Sequence[NemoJob]) -> None:
    """Every planned NeMo job has an interpreter; on the local backend without a container it must also be
    one on this machine. One ConfigError for all of them, naming the key that fixes them."""
    lacking = [job for job in jobs if found(cfg, facts, job)[0] is None]
    if lacking:
        missing = [job.name for job in lacking]
        own = sorted({job.key for job in lacking if job.key})
        where = "this machine runs" if cfg.cluster.backend is BackendName.local else "the nodes run"
        offs = [job for job in lacking if job.off]
        ways = "; ".join(f"{job.off} ({job.off_means})" if job.off_means else str(job.off) for job in offs)
        without = f"; or plan without {', '.join(job.name for job in offs)}: {ways}"
        # When every such job can be planned away, that is the command printed (errors.Fix).
        fix = Fix(set=tuple(str(job.off) for job in offs)) if len(offs) == len(lacking) else None
        raise ConfigError(
            SHARED_KEY,
            f"null, and neither a container nor a NeMo venv ({facts.code_dir}/.venv-nemo) to run "
            f"{', '.join(missing)} with; allowed: a Python with NeMo that {where} (training.run.python=<path> "
            "for every NeMo job" + (f"; {', '.join(own)} for one" if own else "") + "), the image "
            "(container=pyxis container.image=<.sqsh>: docs/generic-slurm.md), or the venv: "
            f"`cd {q(facts.code_dir)} && {MAKE_NEMO_VENV}`" + (without if offs else ""),
            fix,
        )
    if cfg.cluster.backend is not BackendName.local or cfg.container.runtime is not Runtime.none:
        return
    for job in jobs:
        python, key = found(cfg, facts, job)
        if key and python and shutil.which(python) is None:
            raise ConfigError(
                key,
                f"{python!r} is no interpreter on this machine, where the local backend runs {job.name}; "
                f"allowed: a Python with NeMo, e.g. .venv-nemo/bin/python made by `{MAKE_NEMO_VENV}`",
            )
