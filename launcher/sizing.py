"""Task counts sized by the data: how many array tasks reorganize_tar and encode_latents get, and how
long each step should take, printed by the dry run before anything is submitted.

The planned rows are the demo's `num_images`, else the smaller of `download_parquet.max_rows` and
`data_preparation.rows_estimate` (a source's known row count, set by its preset). A step's task count
is its explicit `num_tasks`, else ceil(rows / its `rows_per_task`), never more than the tars the plan
can produce (a task without a tar would idle). Without planned rows a step keeps the count it had
before sizing existed (TASKS_WITHOUT_ROWS) and the dry run says which key to set.

Rows are an upper bound on samples (dead links and filtered images drop rows), so a derived count
errs towards more, shorter tasks. The per-task rates below are labelled as what they are:

    >>> tasks(None, 12_400_000, 4_000_000, ceiling=12_400, without_rows=4)
    4
    >>> [tasks(n, rows, 120, 12, 4) for n, rows in ((None, 240), (3, 240), (None, 10**6), (None, None))]
    [2, 3, 12, 4]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# Re-chunking rate of one reorganize_tar task, measured on this project's 2-core dev machine (raw
# member copy, page cache): 41,609 samples in 1.07 s (docs/scale.md, benchmarks/bench_reorganize.py).
# A shared file system is usually slower: read it as a lower bound on the time.
REORGANIZE_SAMPLES_PER_S = 38_900
# generate_wdinfo reads one count record per tar (no rescan): 26,000 tars per CPU second from 10^3 to
# 10^4 tars (benchmarks/bench_cost_curve.py, same machine, docs/scale.md). One job: the work is a
# listing, not worth an array; a shared file system's metadata latency can make it slower.
WDINFO_TARS_PER_S = 26_000
# Not measured (no GPU here): an estimate of NeMo's VAE + CLIP encode on one H100 at 256 px, from the
# FLOP count (286 GFLOP per image, docs/latents.md) at about 30% of the GPU's bf16 peak.
ENCODE_IMAGES_PER_S_PER_GPU = 1_000
# Counts kept when the rows are unknown: the fixed values the presets used before sizing.
TASKS_WITHOUT_ROWS = {"reorganize_tar": 4, "encode_latents": 2}


def planned_rows(cfg: Any) -> int | None:
    """Rows data preparation will download (the demo's count, max_rows, the source's estimate)."""
    dp = cfg.data_preparation
    if dp.demo.enable:
        return int(dp.demo.num_images)
    # max_rows caps the downloads only: own tars (tars.enable) are all read.
    limits = [dp.rows_estimate, None if dp.tars.enable else dp.download_parquet.max_rows]
    known = [int(n) for n in limits if n]
    return min(known) if known else None


def tasks(explicit: int | None, rows: int | None, per_task: int, ceiling: int, without_rows: int) -> int:
    """The explicit count, else rows / per_task rounded up between 1 and `ceiling` (no rows: the
    `without_rows` count)."""
    if explicit is not None:
        return int(explicit)
    if rows is None:
        return without_rows
    return max(1, min(math.ceil(rows / per_task), ceiling))


def training_tars(cfg: Any, rows: int | None) -> int:
    """Training tars the plan can produce (at least 1): reorganize_tar's outputs."""
    chunk = cfg.data_preparation.reorganize_tar.tar_chunk_size
    return max(1, math.ceil((rows or 0) / chunk))


def reorganize_tasks(cfg: Any) -> int:
    step, rows = cfg.data_preparation.reorganize_tar, planned_rows(cfg)
    without = TASKS_WITHOUT_ROWS["reorganize_tar"]
    return tasks(step.num_tasks, rows, step.rows_per_task, training_tars(cfg, rows), without)


def encode_tasks(cfg: Any) -> int:
    pre, rows = cfg.data_preparation.precache, planned_rows(cfg)
    return tasks(
        pre.num_tasks, rows, pre.rows_per_task, training_tars(cfg, rows), TASKS_WITHOUT_ROWS["encode_latents"]
    )


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(seconds, 1):.0f} s"
    return f"{seconds / 60:,.0f} min" if seconds < 5400 else f"{seconds / 3600:,.1f} h"


@dataclass(frozen=True)
class StepSize:
    step: str
    tasks: int
    basis: str  # where the count comes from: the config key, or why it is fixed
    timing: str  # "about <t> each at <rate> (measured|estimate ...)", or why there is no time

    def describe(self) -> str:
        return f"{self.step}: {self.tasks} task{'s' if self.tasks != 1 else ''} ({self.basis}), {self.timing}"


def _basis(section: str, explicit: int | None) -> str:
    return f"set: {section}.num_tasks" if explicit is not None else f"derived: {section}.rows_per_task"


def _timing(units: float | None, per_s: float, rate: str) -> str:
    if units is None:
        return "time unknown without planned rows"
    return f"about {_duration(units / per_s)} each at {rate}"


def step_sizes(cfg: Any, gpus_per_node: int, encode: bool) -> list[StepSize]:
    """Task count and expected time per task of the steps sized by the rows."""
    dp, rows = cfg.data_preparation, planned_rows(cfg)
    out: list[StepSize] = []
    if dp.reorganize_tar.enable:
        n = reorganize_tasks(cfg)
        rate = f"{REORGANIZE_SAMPLES_PER_S:,} samples/s per task (measured, 2-core dev machine, page cache)"
        out.append(
            StepSize(
                "reorganize_tar",
                n,
                _basis("data_preparation.reorganize_tar", dp.reorganize_tar.num_tasks),
                _timing(None if rows is None else rows / n, REORGANIZE_SAMPLES_PER_S, rate),
            )
        )
    if dp.generate_wdinfo.enable:
        rate = f"{WDINFO_TARS_PER_S:,} tars/s (measured CPU rate, 2-core dev machine)"
        tars = None if rows is None else training_tars(cfg, rows)
        out.append(
            StepSize(
                "generate_wdinfo",
                1,
                "one job: it reads one count record per tar",
                _timing(tars, WDINFO_TARS_PER_S, rate),
            )
        )
    if encode:
        n = encode_tasks(cfg)
        basis = _basis("data_preparation.precache", dp.precache.num_tasks)
        if gpus_per_node < 1:
            out.append(StepSize("encode_latents", n, basis, "on CPUs: no time estimate"))
        else:
            per_node = ENCODE_IMAGES_PER_S_PER_GPU * gpus_per_node
            rate = (
                f"{ENCODE_IMAGES_PER_S_PER_GPU:,} images/s per GPU x {gpus_per_node} (estimate, not measured)"
            )
            out.append(
                StepSize(
                    "encode_latents", n, basis, _timing(None if rows is None else rows / n, per_node, rate)
                )
            )
    return out


def notes(cfg: Any, encode: bool) -> tuple[str, ...]:
    """The dry run's lines about rows, task counts and time."""
    rows = planned_rows(cfg)
    if rows is None:
        head = (
            "sizing: rows unknown, so the steps keep fixed task counts; set data_preparation.rows_estimate "
            "(or download_parquet.max_rows) to size them by the data"
        )
    else:
        head = f"sizing: {rows:,} rows planned, at most {training_tars(cfg, rows):,} tars"
    sizes = step_sizes(cfg, int(cfg.cluster.gpus_per_node), encode)
    return (head, *(f"sizing: {size.describe()}" for size in sizes))
