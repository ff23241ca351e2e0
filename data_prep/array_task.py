"""Which share of a list of tars one process of a Slurm array works on (encode_latents, ControlNet's hints).
Stdlib only."""

from __future__ import annotations

from collections.abc import Mapping


def worker_slot(env: Mapping[str, str]) -> tuple[int, int]:
    """(this process's index, processes in all) from Slurm: array task x tasks per job + procid."""
    task = int(env.get("SLURM_ARRAY_TASK_ID", 0)) - int(env.get("SLURM_ARRAY_TASK_MIN", 0))
    tasks = int(env.get("SLURM_ARRAY_TASK_COUNT", 1))
    procs = int(env.get("SLURM_NTASKS", 1))
    return task * procs + int(env.get("SLURM_PROCID", 0)), tasks * procs


def my_tars(tars: list[str], worker: int, workers: int) -> list[str]:
    """A contiguous slice; every tar goes to exactly one worker."""
    return tars[worker * len(tars) // workers : (worker + 1) * len(tars) // workers]
