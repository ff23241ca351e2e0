"""In-job recovery: NeMo's training under ft_launcher (nvidia-resiliency-ext), when the training config's
`exp_manager.create_fault_tolerance_callback` is true (the GPU cluster presets: conf/fault_tolerance/).

NeMo then adds its FaultToleranceCallback: each rank sends heartbeats to a monitor that ft_launcher starts
beside it. A rank that dies, or sends none within the heartbeat timeout (a hang), makes ft_launcher stop every
rank and start them all again in the same allocation, up to `fault_tolerance.max_rank_restarts` times; NeMo
resumes from the last checkpoint (exp_manager.resume_if_exists). One ft_launcher per node starts that node's
ranks (torchrun's way), so the job has one task per node. ft_launcher reads the timeouts from the same
`fault_tolerance` section in the rendered NeMo config (--ft-cfg-path), as NeMo does.
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from typing import Any

from launcher import nemo_config
from launcher.errors import ConfigError
from launcher.nemo_values import FAULT_TOLERANCE_DEFAULTS
from launcher.quoting import Raw
from launcher.spec import Resources

SWITCH = "training.exp_manager.create_fault_tolerance_callback"
PARAMS = "training.exp_manager.fault_tolerance"
# ft_launcher's own module: the ranks it starts run under this same interpreter (its sys.executable).
FT_LAUNCHER = "nvidia_resiliency_ext.fault_tolerance.launcher"
# The rendezvous of every node's ft_launcher: on the job's first node (where the batch script runs), at a
# port of the job's own so that two jobs sharing a node do not meet.
RENDEZVOUS = (
    "# ft_launcher's rendezvous: this first node, at a port of this job's own.",
    'rdzv_endpoint="$(hostname):$((20000 + SLURM_JOB_ID % 10000))"',
)


# One node's ft_launcher that gives up (restarts spent) ends the others at once.
SRUN_ARGS = ("--kill-on-bad-exit=1",)


def enabled(cfg: Any) -> bool:
    return bool(cfg.training.exp_manager.get("create_fault_tolerance_callback"))


def param(cfg: Any, key: str) -> Any:
    """`fault_tolerance.<key>` as NeMo and ft_launcher read it: the config's, else NeMo's default."""
    return (cfg.training.exp_manager.get("fault_tolerance") or {}).get(key, FAULT_TOLERANCE_DEFAULTS[key])


def check(cfg: Any) -> None:
    """What the value rules (launcher.nemo_values) cannot say alone."""
    if not enabled(cfg):
        return
    if cfg.cluster.gpus_per_node < 1:
        raise ConfigError(
            SWITCH, "is true but cluster.gpus_per_node is 0: in-job recovery restarts GPU ranks"
        )
    failures = param(cfg, "max_subsequent_job_failures")
    if failures != 0:
        raise ConfigError(
            f"{PARAMS}.max_subsequent_job_failures",
            f"{failures!r}: NVIDIA's launcher's job-failure loop is not rendered here (parts continue with "
            "training.run.chain); allowed: 0",
        )
    extra = param(cfg, "additional_ft_launcher_args")
    try:
        shlex.split(str(extra))
    except ValueError as err:
        raise ConfigError(f"{PARAMS}.additional_ft_launcher_args", f"{extra!r}: {err}") from None


def resources(res: Resources) -> Resources:
    """One task per node (its ft_launcher), with the CPUs of all the node's ranks."""
    return dataclasses.replace(res, ntasks_per_node=1, cpus_per_task=res.cpus_per_task * res.ntasks_per_node)


def launcher_argv(cfg: Any, python: str, config: Path) -> tuple[str, ...]:
    """`<python> -m <ft_launcher> ...`, to be followed by the training script and its arguments."""
    s = nemo_config.shape(cfg)
    return (
        python,
        "-m",
        FT_LAUNCHER,
        f"--ft-cfg-path={config}",
        *shlex.split(str(param(cfg, "additional_ft_launcher_args"))),
        Raw('--rdzv-id="$SLURM_JOB_ID"'),
        "--rdzv-backend=c10d",
        Raw('--rdzv-endpoint="$rdzv_endpoint"'),
        f"--nnodes={s.nodes}",
        f"--nproc-per-node={s.gpus_per_node}",
        f"--max-restarts={param(cfg, 'max_rank_restarts')}",
    )


def note(cfg: Any) -> str:
    """The summary's line: what the recovery does, or that there is none."""
    if not enabled(cfg):
        return (
            f"training: no in-job recovery ({SWITCH}=false): a hung rank holds the job until its time limit"
        )
    timeouts = (
        f"the first within {param(cfg, 'initial_rank_heartbeat_timeout'):g} s, "
        f"then every {param(cfg, 'rank_heartbeat_timeout'):g} s"
    )
    if param(cfg, "calculate_timeouts"):
        timeouts += (
            f"; NeMo recalculates both from the observed intervals x {param(cfg, 'safety_factor'):g} "
            "once a run has saved and loaded a checkpoint"
        )
    return (
        f"training: in-job recovery: ft_launcher detects a dead rank at once, or a hung one by its heartbeats "
        f"({timeouts}), and restarts every rank in the same job from the last checkpoint, up to "
        f"{param(cfg, 'max_rank_restarts')} time(s) per job"
    )
