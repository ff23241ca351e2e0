"""How often to checkpoint for the faults a cluster has: Young/Daly's interval and the GPU-hours lost.

With M the job's mean time between failures (the user's node MTBF over the job's nodes: one failed node
stops the job), delta the time one checkpoint takes to write and R the time a restart costs:
- Young/Daly's first-order optimum: tau = sqrt(2 delta M) (J. W. Young, CACM 17(9), 1974; J. T. Daly,
  FGCS 22(3), 2006, gives higher-order terms that matter only when delta is not small against M).
- Expected GPU-hours lost over a run of H hours on G GPUs checkpointing every t (the configured interval):
  (H / M) x (t / 2 + R) x G   (each failure loses half an interval on average, plus the restart)
  + (H / t) x delta x G       (the time spent writing checkpoints).

delta comes from the run's own log when there is one (`write_seconds_from_log`), else it is assumed
(ASSUMED_WRITE_S, named as an assumption in the line).

    >>> round(young_daly_s(60.0, 3600.0))
    657
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

# Assumed when the run has logged no checkpoint save: a minute, named in the line as an assumption.
ASSUMED_WRITE_S = 60.0
# Assumed time a restart costs (requeue, container start, NeMo's start and checkpoint load).
ASSUMED_RESTART_S = 600.0
# The warning's band: the configured interval more than FAR x, or less than 1 / FAR x, Young/Daly's.
FAR = 2.0

# NeMo's NeMoModelCheckpoint._save_checkpoint logs, before a save without EMA (nemo/utils/callbacks/
# nemo_model_checkpoint.py, NeMo 2.4.1 L573; the line is absent at v2.0.0 and on the EMA path):
#   logging.info(f'Checkpoint save for step {trainer.global_step} started at {time.time()}.')
SAVE_STARTED = re.compile(r"Checkpoint save for step (\d+) started at (\d+(?:\.\d+)?)\.")


def young_daly_s(write_s: float, job_mtbf_s: float) -> float:
    """Young/Daly's first-order optimal checkpoint interval, seconds."""
    return math.sqrt(2.0 * write_s * job_mtbf_s)


@dataclass(frozen=True)
class Loss:
    failures: float  # expected over the run
    lost_gpu_h: float  # recomputation and restarts after failures
    overhead_gpu_h: float  # writing checkpoints

    @property
    def total_gpu_h(self) -> float:
        return self.lost_gpu_h + self.overhead_gpu_h


def expected_loss(
    run_s: float, job_mtbf_s: float, interval_s: float, write_s: float, restart_s: float, gpus: int
) -> Loss:
    """The GPU-hours a run of `run_s` seconds is expected to lose (formula in the module docstring)."""
    failures = run_s / job_mtbf_s
    lost = failures * (interval_s / 2.0 + restart_s) * gpus / 3600.0
    overhead = run_s / interval_s * write_s * gpus / 3600.0 if interval_s > 0 else 0.0
    return Loss(failures, lost, overhead)


def write_seconds_from_log(log: str, saved_at: Mapping[int, float]) -> float | None:
    """The longest checkpoint write the log shows: from NeMo's "Checkpoint save for step N started at T."
    to `saved_at[N]`, the newest modification time of that step's checkpoint files (Lightning names them
    `step=N`). A step saved twice (top-k, then `-last`) counts from its last start. Both are the epoch
    time, the first on the node, the second on the file system. None when no logged save has its file."""
    starts = {int(step): float(t) for step, t in SAVE_STARTED.findall(log)}  # the last start per step
    times = [saved_at[step] - t for step, t in starts.items() if step in saved_at and saved_at[step] >= t]
    return max(times) if times else None


def interval_warning(
    every_n_steps: int, step_s: float, optimum_s: float, key: str, max_steps: int
) -> str | None:
    """A warning when checkpointing every `every_n_steps` steps is far from `optimum_s`, naming `key` and
    the value that would meet it (at most the run's `max_steps`: past it, the run's end is its checkpoint)."""
    if every_n_steps < 1 or step_s <= 0:
        return f"{key} is {every_n_steps}: no checkpoint by steps, a failure loses the whole part"
    configured = every_n_steps * step_s
    if 1.0 / FAR <= configured / optimum_s <= FAR:
        return None
    steps = min(max(1, round(optimum_s / step_s)), max_steps)
    return (
        f"checkpoints every {_duration(configured)} ({key}={every_n_steps}) are more than {FAR:g}x "
        f"{'longer' if configured > optimum_s else 'shorter'} than Young/Daly's {_duration(optimum_s)}: "
        f"set {key}={steps}{' (the run is shorter than the interval)' if steps == max_steps else ''}"
    )


def _duration(seconds: float) -> str:
    return f"{seconds / 60:,.0f} min" if seconds < 3 * 3600 else f"{seconds / 3600:,.1f} h"


def fault_line(
    *,
    node_mtbf_h: float,
    nodes: int,
    gpus: int,
    max_steps: int,
    step_s: float,
    every_n_steps: int,
    key: str,
    write_s: float | None,
) -> str:
    """The cost line's fault estimate: Young/Daly's interval, the expected loss, and a warning when the
    configured interval is far from it. `write_s` None = ASSUMED_WRITE_S, said so."""
    mtbf_s, run_s = node_mtbf_h * 3600.0 / max(nodes, 1), max_steps * step_s
    delta, source = (
        (write_s, "measured in this run's log")
        if write_s is not None
        else (ASSUMED_WRITE_S, "assumed: no save timed in this run's logs")
    )
    optimum = young_daly_s(delta, mtbf_s)
    interval = every_n_steps * step_s if every_n_steps > 0 else run_s
    loss = expected_loss(run_s, mtbf_s, interval, delta, ASSUMED_RESTART_S, gpus)
    line = (
        f"faults (cluster.node_mtbf_hours={node_mtbf_h:g}, the user's figure): job MTBF {_duration(mtbf_s)} "
        f"over {nodes} node(s), ~{loss.failures:,.2f} failure(s) over the run; checkpoint write "
        f"{delta:,.0f} s ({source}), restart {ASSUMED_RESTART_S:,.0f} s (assumed); Young/Daly interval "
        f"sqrt(2 x write x MTBF) = {_duration(optimum)}; expected loss {loss.total_gpu_h:,.0f} GPU-hours "
        f"({loss.lost_gpu_h:,.0f} redone or restarting + {loss.overhead_gpu_h:,.0f} writing checkpoints)"
    )
    warning = interval_warning(every_n_steps, step_s, optimum, key, max_steps)
    return f"{line}; WARNING: {warning}" if warning else line
